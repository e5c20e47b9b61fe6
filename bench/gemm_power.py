# Sustained bf16 GEMM (8192^3, torch.matmul = cuBLAS) for DUR seconds (default 25) on the
# GPU machine: its TFLOP/s once the GPU sits at its power cap, for the energy per TFLOP in
# bench/NOTES.md (issue 14, eighth session; sample nvidia-smi power.draw alongside).
# Usage: DUR=25 python3 bench/gemm_power.py
import os, time, torch
n = 8192; dur = float(os.environ.get("DUR", "25"))
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(20): torch.matmul(a, b, out=c)
torch.cuda.synchronize()
t0 = time.time(); it = 0; marks = []
while time.time() - t0 < dur:
    e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(50): torch.matmul(a, b, out=c)
    e1.record(); e1.synchronize()
    marks.append((time.time() - t0, 50 * 2 * n**3 / (e0.elapsed_time(e1) / 1e3) / 1e12))
    it += 50
for t, r in marks[:: max(1, len(marks) // 12)]: print(f"  t {t:5.1f} s: {r:6.1f} TFLOP/s")
last = [r for t, r in marks if t > 5]
print(f"sustained (after 5 s): {sorted(last)[len(last)//2]:.1f} TFLOP/s median over {len(last)} windows of 50 GEMMs")
