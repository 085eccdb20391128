// Tests of --demo_diagnostics (llmc/optim/demo/diagnostics.h) against a straightforward reference written here: the
// chunks' DCT as an explicit double-precision matrix product C1 X C2^T from the cosine formula, top-k by a full sort,
// the window's variance from the stored coefficients of every step, Jaccard with std::set and cosines of dense
// vectors. Also: training is bit-identical with the diagnostics on and off, and the option's refusals.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmc/base/error.h"
#include "llmc/optim/demo/demo_optimizer.h"
#include "test/support/testing.h"

namespace {

// Shapes and names: chunk 32 cuts the 100-row embedding into 25-row chunks, the vector into pieces of 32.
llmc::ParamLayout test_layout() {
    llmc::ParamLayout layout = llmc::ParamLayout::of_shapes({{100, 64}, {64, 96}, {96, 64}, {96}, {128, 64}});
    const char* names[] = {"wte.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_fc.weight", "h.0.ln_1.weight",
                           "h.0.mlp.c_proj.weight"};
    for (size_t i = 0; i < layout.tensors.size(); i++) layout.tensors[i].name = names[i];
    return layout;
}

llmc::OptimizerConfig test_config(int every) {
    llmc::OptimizerConfig cfg;
    cfg.grad_clip = 0.0f;
    cfg.demo.topk = 5;
    cfg.demo.chunk = 32;
    cfg.demo.decay = 0.9f;
    cfg.demo.diagnostics = every;
    return cfg;
}

std::vector<double> cosine_basis(size_t n) {  // C[k][i] = sqrt((k ? 2 : 1) / n) cos(pi (2i + 1) k / 2n)
    std::vector<double> c(n * n);
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < n; i++)
            c[k * n + i] = std::sqrt((k ? 2.0 : 1.0) / n) * std::cos(M_PI * (2.0 * i + 1.0) * k / (2.0 * n));
    return c;
}

// Coefficients of every chunk of the momentum x in basis `kind` ("dct", "random", "raw"), chunk after chunk.
std::vector<std::vector<double>> chunk_coeffs(const demo::ModelPlan& plan, const std::vector<float>& x,
                                              const std::string& kind) {
    std::vector<std::vector<double>> out;
    for (const demo::TensorPlan& tp : plan.tensors) {
        const auto basis = [&](size_t n) {
            if (kind == "dct") return cosine_basis(n);
            std::vector<double> b = demo::random_orthogonal_basis_f64(n);
            if (n == 1) b = {1.0};
            return b;
        };
        const std::vector<double> c1 = kind == "raw" ? std::vector<double>() : basis(tp.n1),
                                  c2 = kind == "raw" ? std::vector<double>() : basis(tp.n2);
        for (size_t c = 0; c < tp.num_chunks; c++) {
            std::vector<double> chunk(tp.n1 * tp.n2), e(tp.n1 * tp.n2, 0.0);
            const size_t br = c / tp.block_cols, bc = c % tp.block_cols;
            for (size_t i = 0; i < tp.n1; i++)
                for (size_t j = 0; j < tp.n2; j++)
                    chunk[i * tp.n2 + j] = x[tp.offset + (br * tp.n1 + i) * tp.cols + bc * tp.n2 + j];
            if (kind == "raw") {
                out.push_back(chunk);
                continue;
            }
            for (size_t a = 0; a < tp.n1; a++)
                for (size_t b = 0; b < tp.n2; b++) {
                    double s = 0.0;
                    for (size_t i = 0; i < tp.n1; i++)
                        for (size_t j = 0; j < tp.n2; j++) s += c1[a * tp.n1 + i] * chunk[i * tp.n2 + j] * c2[b * tp.n2 + j];
                    e[a * tp.n2 + b] = s;
                }
            out.push_back(e);
        }
    }
    return out;
}

std::vector<size_t> topk_of(const std::vector<double>& v, size_t k) {  // by a full sort, ties to the lower index
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
    idx.resize(std::min(k, v.size()));
    std::sort(idx.begin(), idx.end());
    return idx;
}

// group of each chunk, in chunk order
std::vector<std::string> chunk_groups(const demo::ModelPlan& plan, const llmc::ParamLayout& layout) {
    std::vector<std::string> g;
    for (size_t t = 0; t < plan.tensors.size(); t++)
        for (size_t c = 0; c < plan.tensors[t].num_chunks; c++) g.push_back(demo::diagnostic_group(layout.tensors[t]));
    return g;
}

}  // namespace

TEST(groups_by_name_and_shape) {
    const llmc::ParamLayout layout = test_layout();
    EXPECT_EQ(demo::diagnostic_group(layout.tensors[0]), std::string("embeddings"));
    EXPECT_EQ(demo::diagnostic_group(layout.tensors[1]), std::string("attention"));
    EXPECT_EQ(demo::diagnostic_group(layout.tensors[2]), std::string("mlp"));
    EXPECT_EQ(demo::diagnostic_group(layout.tensors[3]), std::string("vectors"));
    llmc::ParamTensor olmo = layout.tensors[2];
    olmo.name = "transformer.blocks.0.ff_out.weight";
    EXPECT_EQ(demo::diagnostic_group(olmo), std::string("mlp"));
}

// Four steps with N = 4 (window W = 4: steps 1..4): the line of step 4 against the reference.
TEST(measures_match_reference) {
    const llmc::ParamLayout layout = test_layout();
    const llmc::OptimizerConfig cfg = test_config(4);
    llmc::LocalTransport transport;
    demo::DemoOptimizer opt(cfg, layout, transport);
    const demo::ModelPlan& plan = opt.plan();
    std::vector<float> params = testing::random_normal(layout.num_params, 1, 0.1);
    const float lr = 0.01f;
    std::vector<std::vector<float>> pre(4);  // momentum at compress time, steps 1..4
    std::string line;
    for (int s = 0; s < 4; s++) {
        std::vector<float> grads = testing::random_normal(layout.num_params, 100 + s, 1.0);
        // scale some columns so that chunks are not white noise (compaction differs between the bases)
        for (size_t i = 0; i < grads.size(); i++) grads[i] += static_cast<float>(std::sin(0.05 * i)) * 3.0f;
        const std::span<const float> m = opt.momentum();
        pre[s].resize(m.size());
        for (size_t i = 0; i < m.size(); i++) pre[s][i] = cfg.demo.decay * m[i] + lr * grads[i];
        opt.set_step(s);
        const llmc::StepResult r = opt.step(params, grads, lr);
        EXPECT_EQ(r.diagnostics.empty(), s != 3);
        if (s < 3) EXPECT(r.seconds.diagnostics > 0.0);  // steps 1..3: the window's coefficients
        if (s == 3) line = r.diagnostics;
    }
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["type"].get<std::string>(), std::string("diagnostics"));
    EXPECT_EQ(j["step"].get<int>(), 4);
    EXPECT_EQ(j["transform"].get<std::string>(), std::string("dct"));
    EXPECT_EQ(j["window"].get<int>(), 4);

    const std::vector<std::string> groups = chunk_groups(plan, layout);
    std::vector<size_t> chunk_k;
    for (const demo::TensorPlan& tp : plan.tensors)
        for (size_t c = 0; c < tp.num_chunks; c++) chunk_k.push_back(tp.k);
    struct Ref {
        double top[3] = {0, 0, 0}, total[3] = {0, 0, 0}, hits = 0, sel = 0, var[2] = {0, 0}, pow[2] = {0, 0};
        double msq = 0, rsq = 0;
    };
    std::map<std::string, Ref> ref;
    const char* kinds[3] = {"dct", "raw", "random"};
    for (int b = 0; b < 3; b++) {
        const auto coeffs = chunk_coeffs(plan, pre[3], kinds[b]);
        for (size_t c = 0; c < coeffs.size(); c++) {
            Ref& r = ref[groups[c]];
            for (double v : coeffs[c]) r.total[b] += v * v;
            for (size_t i : topk_of(coeffs[c], chunk_k[c])) r.top[b] += coeffs[c][i] * coeffs[c][i];
        }
    }
    std::vector<std::vector<std::vector<double>>> window;
    for (int s = 0; s < 4; s++) window.push_back(chunk_coeffs(plan, pre[s], "dct"));
    for (size_t c = 0; c < window[3].size(); c++) {
        Ref& r = ref[groups[c]];
        const std::vector<size_t> now = topk_of(window[3][c], chunk_k[c]), before = topk_of(window[2][c], chunk_k[c]);
        std::vector<size_t> both;
        std::set_intersection(now.begin(), now.end(), before.begin(), before.end(), std::back_inserter(both));
        r.hits += both.size();
        r.sel += now.size();
        const std::set<size_t> sent(now.begin(), now.end());
        for (size_t i = 0; i < window[3][c].size(); i++) {
            double mean = 0, p = 0;
            for (int s = 0; s < 4; s++) {
                mean += window[s][c][i] / 4;
                p += window[s][c][i] * window[s][c][i] / 4;
            }
            const int set = sent.count(i) ? 0 : 1;
            r.var[set] += p - mean * mean;
            r.pow[set] += p;
        }
    }
    const std::span<const float> residual = opt.momentum();
    for (size_t t = 0; t < layout.tensors.size(); t++) {
        Ref& r = ref[demo::diagnostic_group(layout.tensors[t])];
        for (size_t i = layout.tensors[t].offset; i < layout.tensors[t].offset + layout.tensors[t].numel; i++) {
            r.msq += static_cast<double>(pre[3][i]) * pre[3][i];
            r.rsq += static_cast<double>(residual[i]) * residual[i];
        }
    }
    EXPECT_EQ(j["groups"].size(), ref.size());
    for (const auto& [name, r] : ref) {
        std::printf("  %s: dct %.4f raw %.4f random %.4f persistence %.4f tvar %.4f / %.4f\n", name.c_str(),
                    r.top[0] / r.total[0], r.top[1] / r.total[1], r.top[2] / r.total[2], r.hits / r.sel,
                    r.var[0] / r.pow[0], r.var[1] / r.pow[1]);
        const nlohmann::json& g = j["groups"][name];
        EXPECT_NEAR(g["energy_topk_dct"].get<double>(), r.top[0] / r.total[0], 1e-4);
        EXPECT_NEAR(g["energy_topk_raw"].get<double>(), r.top[1] / r.total[1], 1e-6);
        EXPECT_NEAR(g["energy_topk_random"].get<double>(), r.top[2] / r.total[2], 1e-4);
        EXPECT_NEAR(g["persistence"].get<double>(), r.hits / r.sel, 1.01 / r.sel);  // a near tie may flip one
        EXPECT_NEAR(g["tvar_sent"].get<double>(), r.var[0] / r.pow[0], 2e-3);
        EXPECT_NEAR(g["tvar_residual"].get<double>(), r.var[1] / r.pow[1], 2e-3);
        EXPECT_NEAR(g["momentum_norm"].get<double>(), std::sqrt(r.msq), 1e-6 * std::sqrt(r.msq));
        EXPECT_NEAR(g["residual_norm"].get<double>(), std::sqrt(r.rsq), 1e-6 * std::sqrt(r.rsq));
        EXPECT_NEAR(g["residual_ratio"].get<double>(), std::sqrt(r.rsq / r.msq), 1e-6);
        EXPECT(!g.contains("jaccard"));  // one rank: nothing to agree with
    }
}

// The gathered buckets' agreement against dense vectors and std::set.
TEST(agreement_matches_reference) {
    const llmc::ParamLayout layout = test_layout();
    const demo::ModelPlan plan = demo::plan_model({{100, 64}, {64, 96}, {96, 64}, {96}, {128, 64}}, 32, 5);
    std::vector<size_t> group_of_tensor = {0, 1, 2, 3, 2};
    const size_t world = 3;
    std::vector<demo::Selection> sel(world);
    llmc::Rng rng(7);
    for (size_t r = 0; r < world; r++) {
        sel[r].resize(plan);
        for (const demo::TensorPlan& tp : plan.tensors)
            for (size_t c = 0; c < tp.num_chunks; c++) {
                std::set<uint32_t> chosen;  // a small range, so that the ranks overlap often
                while (chosen.size() < tp.k)
                    chosen.insert(static_cast<uint32_t>(rng.next_u64() % std::min<size_t>(tp.chunk_elems, 12)));
                size_t q = tp.select_offset + c * tp.k;
                for (uint32_t i : chosen) {
                    sel[r].indices[q] = i;
                    sel[r].values[q++] = static_cast<float>(rng.normal());
                }
            }
    }
    std::vector<demo::GroupSums> sums(4);
    const std::vector<double> cos = demo::transmitted_agreement(plan, group_of_tensor, 4, sel, world, sums);
    for (size_t g = 0; g < 4; g++) {
        double jac = 0, n = 0, cos_sum = 0;
        std::vector<std::vector<double>> dense(world, std::vector<double>(plan.total_chunks * 64 * 64, 0.0));
        for (size_t t = 0; t < plan.tensors.size(); t++) {
            if (group_of_tensor[t] != g) continue;
            const demo::TensorPlan& tp = plan.tensors[t];
            for (size_t c = 0; c < tp.num_chunks; c++) {
                const size_t q = tp.select_offset + c * tp.k;
                for (size_t r = 0; r < world; r++)
                    for (size_t i = 0; i < tp.k; i++)
                        dense[r][(tp.chunk_offset + c) * 4096 + sel[r].indices[q + i]] = sel[r].values[q + i];
                for (size_t a = 0; a < world; a++)
                    for (size_t b = a + 1; b < world; b++) {
                        const std::set<uint32_t> A(sel[a].indices.begin() + q, sel[a].indices.begin() + q + tp.k),
                            B(sel[b].indices.begin() + q, sel[b].indices.begin() + q + tp.k);
                        std::set<uint32_t> U = A;
                        U.insert(B.begin(), B.end());
                        size_t inter = 0;
                        for (uint32_t i : A) inter += B.count(i);
                        jac += static_cast<double>(inter) / U.size();
                        n++;
                    }
            }
        }
        for (size_t a = 0; a < world; a++)
            for (size_t b = a + 1; b < world; b++) {
                double d = 0, na = 0, nb = 0;
                for (size_t i = 0; i < dense[a].size(); i++) {
                    d += dense[a][i] * dense[b][i];
                    na += dense[a][i] * dense[a][i];
                    nb += dense[b][i] * dense[b][i];
                }
                cos_sum += d / std::sqrt(na * nb);
            }
        EXPECT_NEAR(sums[g].jaccard / sums[g].jaccard_n, jac / n, 1e-12);
        EXPECT_NEAR(cos[g], cos_sum / 3.0, 1e-9);
        EXPECT(jac / n > 0.1);  // the test has overlaps to measure
    }
}

// Diagnostics read the state only: parameters and momentum after 6 steps are bit-identical with N = 2 and off.
TEST(training_unchanged) {
    const llmc::ParamLayout layout = test_layout();
    std::vector<std::vector<float>> params, momentum;
    for (int every : {0, 2}) {
        llmc::LocalTransport transport;
        demo::DemoOptimizer opt(test_config(every), layout, transport);
        std::vector<float> p = testing::random_normal(layout.num_params, 1, 0.1);
        for (int s = 0; s < 6; s++) {
            std::vector<float> g = testing::random_normal(layout.num_params, 200 + s, 1.0);
            opt.set_step(s);
            const llmc::StepResult r = opt.step(p, g, 0.01f);
            EXPECT_EQ(r.diagnostics.empty(), every == 0 || (s + 1) % every != 0);
        }
        params.push_back(p);
        momentum.emplace_back(opt.momentum().begin(), opt.momentum().end());
    }
    EXPECT(params[0] == params[1]);
    EXPECT(momentum[0] == momentum[1]);
}

TEST(topk_says_identity) {
    const llmc::ParamLayout layout = test_layout();
    llmc::LocalTransport transport;
    demo::DemoOptimizer opt(demo::as_topk(test_config(1)), layout, transport);
    std::vector<float> p(layout.num_params, 0.0f), g = testing::random_normal(layout.num_params, 3, 1.0);
    const llmc::StepResult r = opt.step(p, g, 0.01f);
    const nlohmann::json j = nlohmann::json::parse(r.diagnostics);
    EXPECT_EQ(j["transform"].get<std::string>(), std::string("identity"));
    EXPECT(!j["groups"]["mlp"].contains("persistence"));  // the first step has no step before it
    EXPECT(!j["groups"]["mlp"].contains("tvar_sent"));    // N = 1: no window
    g = testing::random_normal(layout.num_params, 4, 1.0);
    const nlohmann::json j2 = nlohmann::json::parse(opt.step(p, g, 0.01f).diagnostics);
    const double persistence = j2["groups"]["mlp"]["persistence"].get<double>();
    EXPECT(persistence >= 0.0 && persistence < 1.0);  // against step 1's selection, not its own
}

TEST(refusals) {
    llmc::OptimizerConfig cfg = test_config(-1);
    EXPECT_ERROR(demo::validate_demo_options(cfg), "--demo_diagnostics must be >= 0 (got -1)");
    cfg = test_config(5);
    cfg.demo.delay = 1;
    EXPECT_ERROR(demo::validate_demo_options(cfg), "runs with flat DeMo only");
}

TEST_MAIN()
