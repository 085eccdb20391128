// Checker for llmc/attention.cuh: causal attention forward (output and the kept softmax probabilities) and
// backward (d qkv) against a CPU implementation per head in double, on a GPT-2 head layout (C=768, 12 heads)
// and the tiny test model's (C=64, 4 heads, T=32); then timing at B=8, T=1024.
// bf16 builds round preatt/att/datt to bf16 between the steps: a preatt of size ~2 rounded to bf16 moves its
// probability by up to ~1%, so each output is checked against a bound proportional to the magnitude of the
// terms it sums (sum of |att * v| for out, the like for the gradients), not to the output's own size, which
// can cancel to near zero. Exit 0 PASS, 1 FAIL, 77 SKIP.
#include "dev/cuda/common.h"
#include "llmc/attention.cuh"

using namespace llmc;

static void check_shape(CudaEnv& env, check::Checker& ck, int B, int T, int C, int NH) {
    const std::string label = "(B=" + std::to_string(B) + ",T=" + std::to_string(T) + ",C=" + std::to_string(C) +
                              ",NH=" + std::to_string(NH) + ")";
    const int HS = C / NH;
    const double scale = 1.0 / std::sqrt(double(HS));
    const auto qkv = check::random_floatX_values(size_t(B) * T * 3 * C, 1.0f, 31);
    const auto dout = check::random_floatX_values(size_t(B) * T * C, 1.0f, 32);
    std::vector<float> ref_out(size_t(B) * T * C), ref_att(size_t(B) * NH * T * T, 0.0f), ref_dqkv(qkv.size(), 0.0f);
    std::vector<float> mag_out(ref_out.size(), 0.0f), mag_dqkv(qkv.size(), 0.0f);  // sums of |terms|

#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            auto at = [&](int t, int which, int d) { return double(qkv[(size_t(b) * T + t) * 3 * C + which * C + h * HS + d]); };
            std::vector<double> att(size_t(T) * T, 0.0), datt(T);
            for (int t = 0; t < T; t++) {
                double mx = -1e300;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++) s += at(t, 0, d) * at(u, 1, d);
                    att[size_t(t) * T + u] = s * scale;
                    mx = std::max(mx, s * scale);
                }
                double sum = 0;
                for (int u = 0; u <= t; u++) sum += (att[size_t(t) * T + u] = std::exp(att[size_t(t) * T + u] - mx));
                for (int u = 0; u <= t; u++) att[size_t(t) * T + u] /= sum;
                for (int u = 0; u < T; u++) ref_att[((size_t(b) * NH + h) * T + t) * T + u] = float(att[size_t(t) * T + u]);
                for (int d = 0; d < HS; d++) {
                    double y = 0, m = 0;
                    for (int u = 0; u <= t; u++) {
                        y += att[size_t(t) * T + u] * at(u, 2, d);
                        m += att[size_t(t) * T + u] * std::fabs(at(u, 2, d));
                    }
                    ref_out[(size_t(b) * T + t) * C + h * HS + d] = float(y);
                    mag_out[(size_t(b) * T + t) * C + h * HS + d] = float(m);
                }
            }
            // backward
            auto dq = [&](int t, int which, int d) -> float& { return ref_dqkv[(size_t(b) * T + t) * 3 * C + which * C + h * HS + d]; };
            auto mq = [&](int t, int which, int d) -> float& { return mag_dqkv[(size_t(b) * T + t) * 3 * C + which * C + h * HS + d]; };
            std::vector<double> datt_mag(T);
            for (int t = 0; t < T; t++) {
                const float* dy = &dout[(size_t(b) * T + t) * C + h * HS];
                double dot = 0, dot_mag = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0, m = 0;
                    for (int d = 0; d < HS; d++) {
                        s += dy[d] * at(u, 2, d);
                        m += std::fabs(dy[d] * at(u, 2, d));
                    }
                    datt[u] = s;
                    datt_mag[u] = m;
                    dot += s * att[size_t(t) * T + u];
                    dot_mag += m * att[size_t(t) * T + u];
                    for (int d = 0; d < HS; d++) {
                        dq(u, 2, d) += float(att[size_t(t) * T + u] * dy[d]);
                        mq(u, 2, d) += float(att[size_t(t) * T + u] * std::fabs(dy[d]));
                    }
                }
                for (int u = 0; u <= t; u++) {
                    const double dpre = scale * att[size_t(t) * T + u] * (datt[u] - dot);
                    const double dpre_mag = scale * att[size_t(t) * T + u] * (datt_mag[u] + dot_mag);
                    for (int d = 0; d < HS; d++) {
                        dq(t, 0, d) += float(dpre * at(u, 1, d));
                        dq(u, 1, d) += float(dpre * at(t, 0, d));
                        mq(t, 0, d) += float(dpre_mag * std::fabs(at(u, 1, d)));
                        mq(u, 1, d) += float(dpre_mag * std::fabs(at(t, 0, d)));
                    }
                }
            }
        }

    auto d_qkv = check::to_device_floatX(qkv);
    auto d_dout = check::to_device_floatX(dout);
    const size_t btc = size_t(B) * T * C;
    DeviceBuffer<floatX> out(btc), qkvr(3 * btc), att(attention_scratch_elems(B, T, NH)),
        preatt(attention_scratch_elems(B, T, NH)), dinp(3 * btc), dqkvr(3 * btc), datt(attention_scratch_elems(B, T, NH)),
        dy(btc);
    attention_forward(env, out.data(), qkvr.data(), att.data(), preatt.data(), d_qkv.data(), B, T, C, NH);
    env.sync();
    const float factor = kFloatXIsFloat ? 1e-4f : 2e-2f;
    ck.compare_bound("forward out " + label, check::from_device_floatX(out), ref_out, mag_out, factor);
    ck.compare("forward att " + label, check::from_device_floatX(att), ref_att, 1e-3f);
    attention_backward(env, dinp.data(), dqkvr.data(), datt.data(), dy.data(), d_dout.data(), qkvr.data(), att.data(), B, T, C, NH);
    env.sync();
    const auto g = check::from_device_floatX(dinp);
    // compare q, k, v gradients separately (different scales)
    for (int which = 0; which < 3; which++) {
        std::vector<float> gw, rw, mw;
        for (size_t bt = 0; bt < size_t(B) * T; bt++)
            for (int c = 0; c < C; c++) {
                gw.push_back(g[bt * 3 * C + which * C + c]);
                rw.push_back(ref_dqkv[bt * 3 * C + which * C + c]);
                mw.push_back(mag_dqkv[bt * 3 * C + which * C + c]);
            }
        const char* names[3] = {"backward dq ", "backward dk ", "backward dv "};
        ck.compare_bound(names[which] + label, gw, rw, mw, 2 * factor);
    }
}

int main() {
    return check::run_checker("attention", [](CudaEnv& env, check::Checker& ck) {
        check_shape(env, ck, 2, 256, 768, 12);
        check_shape(env, ck, 4, 32, 64, 4);  // the tiny reference model
        check_shape(env, ck, 2, 37, 48, 4);  // head size 12, T 37: the scalar (non-128-bit) kernels
        const int B = 8, T = 1024, C = 768, NH = 12;
        const size_t btc = size_t(B) * T * C;
        DeviceBuffer<floatX> qkv(3 * btc), out(btc), qkvr(3 * btc), att(attention_scratch_elems(B, T, NH)),
            preatt(attention_scratch_elems(B, T, NH)), dinp(3 * btc), dqkvr(3 * btc), datt(attention_scratch_elems(B, T, NH)),
            dy(btc);
        CUDA_CHECK(cudaMemset(qkv.data(), 0, qkv.bytes()));
        CUDA_CHECK(cudaMemset(out.data(), 0, out.bytes()));
        const double flops = 4.0 * B * NH * double(T) * T * (C / NH);  // two full-square matmuls (causal half wasted)
        const float f = check::time_ms(env.stream, 10, [&] {
            attention_forward(env, out.data(), qkvr.data(), att.data(), preatt.data(), qkv.data(), B, T, C, NH);
        });
        check::report_flops("attention_forward (B=8,T=1024)", f, flops);
        const float b = check::time_ms(env.stream, 10, [&] {
            attention_backward(env, dinp.data(), dqkvr.data(), datt.data(), dy.data(), out.data(), qkvr.data(), att.data(), B, T, C, NH);
        });
        check::report_flops("attention_backward (B=8,T=1024)", b, 2 * flops);
    });
}
