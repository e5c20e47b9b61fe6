/* Cross-entropy forward+backward on one chunk of logits, in place. */
#include <math.h>

#include "common/ops/cpu/cpu.h"

/* logits (N,V) -> dlogits = w[n] * grad_scale * (softmax - onehot(target));
 * loss[n] = w[n] * (logsumexp - logit[target]) (assigned; may be NULL);
 * correct[n] = argmax == target, ties to the lowest index (may be NULL). */
void ops_cpu_xent_forward_backward(const ops_ctx_t *c, void *logits_, float *loss, float *correct,
                                   const int32_t *targets, const float *w, float grad_scale,
                                   int N, int V) {
    float *logits = logits_;
#pragma omp parallel for num_threads(ops_cpu__threads(c)) schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (long)n * V;
        int tg = targets[n], am = 0;
        float mx = x[0];
        for (int i = 1; i < V; i++)
            if (x[i] > mx) { mx = x[i]; am = i; }
        if (correct) correct[n] = (am == tg) ? 1.0f : 0.0f;
        if (w[n] == 0.0f) {
            if (loss) loss[n] = 0.0f;
            for (int i = 0; i < V; i++) x[i] = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp((double)(x[i] - mx));
        double lse = mx + log(sum);
        if (loss) loss[n] = (float)(w[n] * (lse - x[tg]));
        float gs = w[n] * grad_scale;
        for (int i = 0; i < V; i++) x[i] = gs * (float)exp((double)x[i] - lse);
        x[tg] -= gs;
    }
}
