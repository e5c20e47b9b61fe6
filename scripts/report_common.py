"""Readers shared by the one-call GPU run reports (scripts/gpu_x2_report.py,
scripts/gpu_scale_report.py): the run summary line, log timestamps, text and JSONL files
that may be missing or torn. Standard library only (the GPU machine has no extra packages)."""
import datetime
import json
import re

SUMMARY = re.compile(r"^summary: (\d+) steps.*?steady ([0-9.]+) target tokens/s.*?wall ([0-9.]+) target tokens/s "
                     r"over ([0-9.]+) s \(start-up ([0-9.]+) s.*?(\d+) restart", re.M)
TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")


def read(p):
    try:
        with open(p, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def jsonl(p):
    out = []
    for line in read(p).splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def wall(line):
    m = TS.match(line)
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()
