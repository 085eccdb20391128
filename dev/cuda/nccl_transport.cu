// Checker for llmc/comm/transport_nccl.cuh on one GPU (a one-rank NCCL communicator, so every NCCL call runs) or,
// under mpirun with one GPU per rank, across ranks:
//   mpirun -np 2 build/cuda/nccl_transport
// Checks allreduce_mean (device and host buffers), allreduce_mean_bf16, the overlapped all-reduce
// (allreduce_mean_start / _wait / _finish, both wires; a start of many ranges packed into one all-reduce),
// allgather_bytes (device and host contributions, uneven and empty buckets), allgather_device, its split form
// (allgather_device_start / _finish, DeMo's --demo_delay 1: the same contents and counters, with other
// collectives and compute-stream work in between), the same with GatherSizes::equal (no size exchange: one
// ncclAllGather), device broadcast, scalar reductions and the byte counters' ring model; and
// HostStagedTransport's overlapped all-reduce (--transport mpi: through pinned host memory on a copy stream,
// neither start nor finish waiting for the compute stream; allreduce_mean_wait brings the early ranges back
// before finish); groups (split): the reduce-scatter and in-place all-gather of the sharded steps, through NCCL and
// through host memory, and their counters by link.
// The emulated build (build/emu/nccl_transport, NCCL over MPI) runs in `make test` at 1, 2 and 3 ranks.
// Exit 0 PASS, 1 FAIL, 77 SKIP (no GPU).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "dev/cuda/common.h"
#include "llmc/comm/transport_mpi.h"
#include "llmc/comm/transport_nccl.cuh"
#include "llmc/comm/transport_staged.cuh"

using namespace llmc;

int main(int argc, char** argv) {
    skip_without_cuda_device();
    std::unique_ptr<Transport> world;
    try {
        world = make_world_transport(&argc, &argv);
        const int W = world->world_size(), r = world->rank();
        CUDA_CHECK(cudaSetDevice(local_device_index(r)));
        CudaEnv env(local_device_index(r));
        NcclTransport t(*world, env.stream, /*nccl_for_one_rank=*/true);
        if (r == 0) std::printf("nccl_transport: %d rank(s), %s, NCCL %s\n", W, env.describe().c_str(), t.uses_nccl() ? "on" : "off");
        check::Checker ck;

        // allreduce_mean, device buffer
        const size_t n = 1000003;
        std::vector<float> host(n);
        for (size_t i = 0; i < n; i++) host[i] = float(r) + 0.001f * float(i % 1000);
        DeviceBuffer<float> dev(n);
        dev.upload(host);
        t.reset_counters();
        t.allreduce_mean(std::span<float>(dev.data(), n));
        std::vector<float> want(n);
        for (size_t i = 0; i < n; i++) want[i] = float(W - 1) / 2.0f + 0.001f * float(i % 1000);
        ck.compare("allreduce_mean (device)", dev.download(), want, 1e-6f, 1e-6f);
        const uint64_t wire = 2 * uint64_t(W - 1) * n * sizeof(float) / W;
        ck.expect(t.counters().bytes_sent == wire && t.counters().bytes_recv == wire &&
                      t.counters().payload_bytes == n * sizeof(float),
                  "allreduce counters (ring model)");
        // host buffer
        t.allreduce_mean(std::span<float>(host));
        ck.compare("allreduce_mean (host)", host, want, 1e-6f, 1e-6f);

        // allreduce_mean_bf16 (--grad_wire bf16). Values r + (i % 4) / 4 and their sums (W <= 8) are exact in bf16,
        // so the mean is sum * (1 / W) in fp32 whatever the reduction order; every 1000th element is 1 + 2^-9 on
        // every rank, which bf16 rounds to 1 before the sum: the mean is 1, not 1 + 2^-9 as an fp32 wire gives.
        {
            const size_t nb = 100003;
            std::vector<float> x(nb), want_bf16(nb);
            for (size_t i = 0; i < nb; i++) {
                const bool rounds = i % 1000 == 0;
                x[i] = rounds ? 1.0f + 1.0f / 512.0f : float(r) + 0.25f * float(i % 4);
                const float sum = rounds ? float(W) : float(W * (W - 1) / 2) + float(W) * 0.25f * float(i % 4);
                want_bf16[i] = sum * (1.0f / float(W));
            }
            DeviceBuffer<float> xd(nb);
            xd.upload(x);
            t.reset_counters();
            t.allreduce_mean_bf16(std::span<float>(xd.data(), nb));
            ck.compare("allreduce_mean_bf16 (device)", xd.download(), want_bf16, 0.0f, 0.0f);
            const uint64_t wire16 = 2 * uint64_t(W - 1) * nb * 2 / W;
            ck.expect(t.counters().bytes_sent == wire16 && t.counters().bytes_recv == wire16 &&
                          t.counters().payload_bytes == nb * 2,
                      "allreduce_mean_bf16 counters (ring model, 2 bytes per value)");
            t.allreduce_mean_bf16(std::span<float>(x));
            ck.compare("allreduce_mean_bf16 (host)", x, want_bf16, 0.0f, 0.0f);
        }

        // The overlapped all-reduce (allreduce_mean_start / _finish): ranges in backward order (high offsets first),
        // over two start() calls, one empty range and a gap [gap_lo, gap_hi) that no range covers and must stay as
        // it was.
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const size_t no = 70001, gap_lo = 30000, gap_hi = 30017;
            std::vector<float> x(no), want_o(no);
            for (size_t i = 0; i < no; i++) {
                x[i] = float(r) + 0.25f * float(i % 4);
                const float sum = float(W * (W - 1) / 2) + float(W) * 0.25f * float(i % 4);
                want_o[i] = i >= gap_lo && i < gap_hi ? x[i] : bf16 ? sum * (1.0f / float(W)) : sum / float(W);
            }
            DeviceBuffer<float> xd(no);
            xd.upload(x);
            t.reset_counters();
            const ParamRange first[] = {{50000, no - 50000}, {gap_hi, 50000 - gap_hi}};
            const ParamRange second[] = {{1000, 0}, {1, gap_lo - 1}, {0, 1}};
            t.allreduce_mean_start(xd.data(), no, first, bf16 != 0);
            t.allreduce_mean_start(xd.data(), no, second, bf16 != 0);
            const std::string what = std::string("overlapped all-reduce (") + (bf16 ? "bf16" : "fp32") + " wire)";
            t.allreduce_mean_wait(2);  // before finish(): every range averaged
            ck.compare(what + ", allreduce_mean_wait(2)", xd.download(), want_o, bf16 ? 0.0f : 1e-6f, bf16 ? 0.0f : 1e-6f);
            t.allreduce_mean_finish();
            ck.compare(what, xd.download(), want_o, bf16 ? 0.0f : 1e-6f, bf16 ? 0.0f : 1e-6f);
            const uint64_t covered = (no - (gap_hi - gap_lo)) * (bf16 ? 2 : 4);
            const uint64_t wire_o = 2 * uint64_t(W - 1) * covered / W;
            ck.expect(t.counters().bytes_sent == wire_o && t.counters().bytes_recv == wire_o &&
                          t.counters().payload_bytes == covered,
                      what + ": counters of the covered elements as one buffer (ring model)");
        }

        // A start of many ranges (more than NcclTransport::kPackedRanges: packed into one all-reduce), the embedding
        // rows no input touches in the trainer: 40 runs of uneven lengths with gaps that must stay as they were, in
        // one start, then a start of two ranges that travel on their own.
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const size_t np = 60000;
            std::vector<ParamRange> many, two = {{52000, 3000}, {56000, 4000}};
            for (size_t k = 0; k < 40; k++) many.push_back({k * 1250 + k % 7, 200 + 23 * k});
            std::vector<char> covered(np, 0);
            for (const auto* part : {&many, &two})
                for (const ParamRange& rr : *part)
                    std::fill(covered.begin() + rr.offset, covered.begin() + rr.offset + rr.numel, 1);
            std::vector<float> x(np), want_p(np);
            size_t covered_elems = 0;
            for (size_t i = 0; i < np; i++) {
                x[i] = float(r) + 0.25f * float(i % 4);
                const float sum = float(W * (W - 1) / 2) + float(W) * 0.25f * float(i % 4);
                want_p[i] = !covered[i] ? x[i] : bf16 ? sum * (1.0f / float(W)) : sum / float(W);
                covered_elems += covered[i];
            }
            DeviceBuffer<float> xd(np);
            xd.upload(x);
            t.reset_counters();
            t.allreduce_mean_start(xd.data(), np, many, bf16 != 0);
            t.allreduce_mean_start(xd.data(), np, two, bf16 != 0);
            t.allreduce_mean_finish();
            const std::string what =
                std::string("overlapped all-reduce of 40 ranges packed (") + (bf16 ? "bf16" : "fp32") + " wire)";
            ck.compare(what, xd.download(), want_p, bf16 ? 0.0f : 1e-6f, bf16 ? 0.0f : 1e-6f);
            const uint64_t wire_p = 2 * uint64_t(W - 1) * covered_elems * (bf16 ? 2 : 4) / W;
            ck.expect(t.counters().bytes_sent == wire_p && t.counters().payload_bytes == covered_elems * (bf16 ? 2 : 4),
                      what + ": counters of the covered elements (ring model)");
        }

        // The same overlapped all-reduce through host memory (HostStagedTransport, --transport mpi). The
        // gradient is written on the compute stream just before (a device copy, as the backward writes it), so
        // a staging copy not ordered after it reads the fresh allocation's contents. The emulated device runs
        // work only when the host waits for it: there, the compute stream still has work queued after start()
        // and after finish() shows that neither waited for it (the backward and the copies back run on).
        {
            HostStagedTransport staged(*world, env.stream);
            const size_t no = 70001, gap_lo = 30000, gap_hi = 30017;
            std::vector<float> x(no), want_s(no);
            for (size_t i = 0; i < no; i++) {
                x[i] = float(r) + 0.25f * float(i % 4);
                const float sum = float(W * (W - 1) / 2) + float(W) * 0.25f * float(i % 4);
                want_s[i] = i >= gap_lo && i < gap_hi ? x[i] : sum / float(W);
            }
            for (int step = 0; step < 2; step++) {  // the second step reuses the staging buffer and the events
                DeviceBuffer<float> src(no), xd(no), seen(no);
                src.upload(x);
                CUDA_CHECK(cudaMemcpyAsync(xd.data(), src.data(), no * sizeof(float), cudaMemcpyDeviceToDevice, env.stream));
                staged.reset_counters();
                const ParamRange first[] = {{50000, no - 50000}, {gap_hi, 50000 - gap_hi}};
                const ParamRange second[] = {{1000, 0}, {1, gap_lo - 1}, {0, 1}};
                staged.allreduce_mean_start(xd.data(), no, first, false);
#if defined(LLMC_BLOCK_EMULATOR)
                ck.expect(cudaStreamQuery(env.stream) == cudaErrorNotReady,
                          "host-staged overlapped all-reduce: start() does not wait for the compute stream");
#endif
                staged.allreduce_mean_start(xd.data(), no, second, false);
                if (step == 0) {  // the first start's ranges averaged and back on the device before finish()
                    staged.allreduce_mean_wait(1);
                    const std::vector<float> early = xd.download();
                    size_t off = 0;
                    for (size_t i = gap_hi; i < no; i++)  // NaN (never written) counts as off
                        off += !(std::fabs(early[i] - want_s[i]) <= 1e-6f * (1.0f + std::fabs(want_s[i])));
                    ck.expect(off == 0, "host-staged overlapped all-reduce: allreduce_mean_wait(1) gives the first start's "
                                        "ranges averaged on the device");
                }
                staged.allreduce_mean_finish();
#if defined(LLMC_BLOCK_EMULATOR)
                ck.expect(cudaStreamQuery(env.stream) == cudaErrorNotReady,
                          "host-staged overlapped all-reduce: finish() does not wait for the copies back");
#endif
                CUDA_CHECK(cudaMemcpyAsync(seen.data(), xd.data(), no * sizeof(float), cudaMemcpyDeviceToDevice, env.stream));
                CUDA_CHECK(cudaStreamSynchronize(env.stream));
                const std::string what = "host-staged overlapped all-reduce, step " + std::to_string(step + 1);
                ck.compare(what + " (read on the compute stream)", seen.download(), want_s, 1e-6f, 1e-6f);
                const uint64_t covered = (no - (gap_hi - gap_lo)) * sizeof(float);
                const uint64_t wire_s = 2 * uint64_t(W - 1) * covered / W;
                ck.expect(staged.counters().bytes_sent == wire_s && staged.counters().bytes_recv == wire_s &&
                              staged.counters().payload_bytes == covered,
                          what + ": counters of the covered elements as one buffer (ring model)");
            }
            // a blocking staged collective after the overlapped one: the copies back are done before it reuses
            // the staging buffer
            DeviceBuffer<float> after(1000);
            after.upload(std::vector<float>(1000, float(r)));
            staged.allreduce_mean(std::span<float>(after.data(), 1000));
            ck.compare("host-staged allreduce_mean after the overlapped all-reduce", after.download(),
                       std::vector<float>(1000, float(W - 1) / 2.0f), 1e-6f, 1e-6f);
        }

        // allgather_bytes: rank q contributes size(q) bytes with value (7q + j) & 0xff; rank 1 contributes nothing
        auto size_of = [&](int q) { return (W > 1 && q == 1) ? size_t(0) : size_t(37 * q + 5); };
        auto byte_of = [](int q, size_t j) { return std::byte(static_cast<unsigned char>((7 * q + j) & 0xff)); };
        std::vector<std::byte> mine(size_of(r));
        for (size_t j = 0; j < mine.size(); j++) mine[j] = byte_of(r, j);
        DeviceBuffer<std::byte> mine_dev(std::max<size_t>(1, mine.size()));
        if (!mine.empty()) mine_dev.upload(mine);
        size_t total = 0;
        for (int q = 0; q < W; q++) total += size_of(q);
        auto verify = [&](const std::vector<std::byte>& all, const std::vector<size_t>& offsets, const std::string& what) {
            bool ok = offsets.size() == size_t(W + 1) && all.size() >= total && offsets[W] == total;
            for (int q = 0; ok && q < W; q++) {
                ok &= offsets[q + 1] - offsets[q] == size_of(q);
                for (size_t j = 0; ok && j < size_of(q); j++) ok &= all[offsets[q] + j] == byte_of(q, j);
            }
            ck.expect(ok, what);
        };
        for (int from_device = 0; from_device < 2; from_device++) {
            std::vector<std::byte> all;
            std::vector<size_t> offsets;
            t.reset_counters();
            const std::span<const std::byte> src = from_device ? std::span<const std::byte>(mine_dev.data(), mine.size())
                                                               : std::span<const std::byte>(mine);
            t.allgather_bytes(src, all, offsets, GatherSizes::exchange);
            verify(all, offsets, from_device ? "allgather_bytes (device mine)" : "allgather_bytes (host mine)");
            const uint64_t recv = total - size_of(r);
            const uint64_t sent = W > 1 ? total - size_of((r + 1) % W) : 0;
            ck.expect(t.counters().bytes_recv == recv && t.counters().bytes_sent == sent &&
                          t.counters().payload_bytes == size_of(r) &&
                          t.counters().size_exchanges == (t.uses_nccl() ? 1u : 0u),
                      "allgather counters (ring model; one size exchange over NCCL)");
        }
        {
            DeviceBuffer<std::byte> out(total + 16);
            std::vector<size_t> offsets;
            t.reset_counters();
            t.allgather_device(std::span<const std::byte>(mine_dev.data(), mine.size()), out.data(), out.size(), offsets,
                               GatherSizes::exchange);
            verify(out.download(), offsets, "allgather_device");
            const CommCounters whole = t.counters();
            // split: a scalar reduction and a device all-reduce in between, and a kernel-free copy on the compute
            // stream after finish() that must see the gathered bytes (the stream waits for the broadcasts)
            DeviceBuffer<std::byte> out2(total + 16), copy(total + 16);
            std::vector<size_t> offsets2;
            t.reset_counters();
            t.allgather_device_start(std::span<const std::byte>(mine_dev.data(), mine.size()), out2.data(), out2.size(),
                                     offsets2, GatherSizes::exchange);
            ck.expect(t.allgather_device_in_flight() && offsets2 == offsets, "allgather_device_start: offsets at once");
            std::vector<double> between = {1.0};
            t.allreduce_sum(between);
            t.allgather_device_finish();
            ck.expect(!t.allgather_device_in_flight() && between[0] == W, "allgather_device_finish (collectives between)");
            CUDA_CHECK(cudaMemcpyAsync(copy.data(), out2.data(), total, cudaMemcpyDeviceToDevice, env.stream));
            CUDA_CHECK(cudaStreamSynchronize(env.stream));
            std::vector<std::byte> got = copy.download();
            verify(got, offsets2, "allgather_device_start / _finish (read on the compute stream)");
            const CommCounters& split = t.counters();
            ck.expect(split.bytes_sent == whole.bytes_sent && split.bytes_recv == whole.bytes_recv &&
                          split.payload_bytes == whole.payload_bytes && split.collectives == whole.collectives &&
                          whole.collectives == 1 && whole.payload_bytes == size_of(r),
                      "allgather_device_start / _finish counters equal allgather_device's (one collective)");
        }
        {
            // GatherSizes::equal (DeMo after its first round): every rank 53 bytes, no size exchange; one
            // ncclAllGather in place. The same bytes, offsets and counters as the exchanging all-gather's.
            const size_t E = 53;
            std::vector<std::byte> eq(E);
            for (size_t j = 0; j < E; j++) eq[j] = byte_of(r, j);
            DeviceBuffer<std::byte> eq_dev(E), out(E * W + 16), copy(E * W);
            eq_dev.upload(eq);
            auto verify_equal = [&](const std::vector<std::byte>& all, const std::vector<size_t>& offsets,
                                    const std::string& what) {
                bool ok = offsets.size() == size_t(W + 1) && all.size() >= E * W;
                for (int q = 0; ok && q < W; q++) {
                    ok &= offsets[q] == E * q && offsets[q + 1] == E * (q + 1);
                    for (size_t j = 0; ok && j < E; j++) ok &= all[E * q + j] == byte_of(q, j);
                }
                const uint64_t wire = E * uint64_t(W - 1);
                ok &= t.counters().bytes_recv == wire && t.counters().bytes_sent == wire &&
                      t.counters().payload_bytes == E && t.counters().collectives == 1 &&
                      t.counters().size_exchanges == 0;
                ck.expect(ok, what + " (GatherSizes::equal): bytes, offsets and counters");
            };
            for (int from_device = 0; from_device < 2; from_device++) {
                std::vector<std::byte> all;
                std::vector<size_t> offsets;
                t.reset_counters();
                t.allgather_bytes(from_device ? std::span<const std::byte>(eq_dev.data(), E) : std::span<const std::byte>(eq),
                                  all, offsets, GatherSizes::equal);
                verify_equal(all, offsets, from_device ? "allgather_bytes (device mine)" : "allgather_bytes (host mine)");
            }
            std::vector<size_t> offsets;
            t.reset_counters();
            CUDA_CHECK(cudaMemset(out.data(), 0, out.bytes()));
            t.allgather_device_start(std::span<const std::byte>(eq_dev.data(), E), out.data(), out.size(), offsets,
                                     GatherSizes::equal);
            std::vector<double> between = {1.0};
            t.allreduce_sum(between);
            t.allgather_device_finish();
            CUDA_CHECK(cudaMemcpyAsync(copy.data(), out.data(), E * W, cudaMemcpyDeviceToDevice, env.stream));
            CUDA_CHECK(cudaStreamSynchronize(env.stream));
            verify_equal(copy.download(), offsets, "allgather_device_start / _finish");
            ck.expect(between[0] == W, "allgather_device_finish (GatherSizes::equal; collectives between)");
        }
        // device broadcast from the last rank
        std::vector<float> b(1000, float(r));
        DeviceBuffer<float> bd(1000);
        bd.upload(b);
        t.broadcast(std::span<std::byte>(reinterpret_cast<std::byte*>(bd.data()), bd.bytes()), W - 1);
        ck.compare("broadcast (device)", bd.download(), std::vector<float>(1000, float(W - 1)), 0.0f, 0.0f);
        // scalars
        std::vector<double> s = {double(r), 1.0};
        t.allreduce_sum(s);
        ck.expect(s[0] == W * (W - 1) / 2.0 && s[1] == W, "allreduce_sum (host scalars)");
        std::vector<double> mx = {double(r)};
        t.allreduce_max(mx);
        ck.expect(mx[0] == W - 1, "allreduce_max (host scalars)");
        t.barrier();

#if !defined(LLMC_BLOCK_EMULATOR)  // the emulated build checks the results only
        // timing: all-reduce of a 124M-parameter gradient
        DeviceBuffer<float> grads(124475904);
        CUDA_CHECK(cudaMemset(grads.data(), 0, grads.bytes()));
        const float ms = check::time_ms(env.stream, 5, [&] { t.allreduce_mean(std::span<float>(grads.data(), grads.size())); });
        if (r == 0) check::report_bandwidth("allreduce_mean 124M fp32 (bus bw)", ms, 2.0 * (W - 1) / std::max(W, 1) * grads.bytes() + (W == 1 ? grads.bytes() : 0));
        // Groups (the sharded steps): the ranks of each parity split off (ncclCommSplit beside the MPI split), and
        // in each group the in-place reduce-scatter (uneven ranges, an empty one) and all-gather, through NCCL and
        // through host memory. Values g + (i % 4) / 4 and their sums are exact: the mean is sum * (1 / size).
        {
            HostStagedTransport staged_world(*world, env.stream);
            for (Transport* parent : {static_cast<Transport*>(&t), static_cast<Transport*>(&staged_world)}) {
                const std::string who = parent == &t ? "NCCL group" : "host-staged group";
                std::unique_ptr<Transport> group = parent->split(r % 2, r, Link::intra);
                const int S = group->world_size(), g = group->rank();
                ck.expect(S == (W + 1 - r % 2) / 2 && g == r / 2, who + ": size and rank of the split");
                const size_t ng = 10007;
                std::vector<size_t> offsets = {0};
                for (int p = 0; p < S; p++) offsets.push_back(p == 0 && S > 1 ? 0 : ng * size_t(p + 1) / size_t(S));
                offsets.back() = ng;
                std::vector<float> x(ng), mean(ng);
                for (size_t i = 0; i < ng; i++) x[i] = float(r) + 0.25f * float(i % 4);
                for (size_t i = 0; i < ng; i++) {
                    float sum = 0.0f;
                    for (int q = 0; q < S; q++) sum += float(2 * q + r % 2) + 0.25f * float(i % 4);
                    mean[i] = sum * (1.0f / float(S));
                }
                DeviceBuffer<float> xd(ng);
                xd.upload(x);
                parent->reset_counters();
                group->reduce_scatter_mean(std::span<float>(xd.data(), ng), offsets);
                const std::vector<float> got = xd.download();
                const size_t lo = offsets[size_t(g)], hi = offsets[size_t(g) + 1];
                ck.compare(who + ": reduce_scatter_mean, this rank's range",
                           std::vector<float>(got.begin() + lo, got.begin() + hi),
                           std::vector<float>(mean.begin() + lo, mean.begin() + hi), 0.0f, 0.0f);
                const CommCounters rs = parent->counters();
                ck.expect(rs.bytes_sent == (ng - (hi - lo)) * sizeof(float) * (S > 1) && rs.bytes_sent_intra == rs.bytes_sent &&
                              rs.bytes_sent_inter == 0 && rs.payload_bytes == ng * sizeof(float),
                          who + ": reduce-scatter counted as intra-node traffic in the parent");
                // the all-gather: every rank's range of bytes (its group rank in them) reaches the others
                std::vector<size_t> byte_offsets;
                for (size_t o : offsets) byte_offsets.push_back(o * sizeof(float));
                std::vector<float> mine(ng, -1.0f), all(ng);
                for (int q = 0; q < S; q++)
                    for (size_t i = offsets[size_t(q)]; i < offsets[size_t(q) + 1]; i++) all[i] = float(q) + float(i);
                std::copy(all.begin() + lo, all.begin() + hi, mine.begin() + lo);
                xd.upload(mine);
                group->allgather_inplace(std::as_writable_bytes(std::span<float>(xd.data(), ng)), byte_offsets);
                ck.compare(who + ": allgather_inplace", xd.download(), all, 0.0f, 0.0f);
            }
        }

        // timing: DeMo's bucket all-gather (GPT-2 124M, k=32, fp32 values: 6,132,512 bytes per rank) with the size
        // exchange (the first round's; every round's before 2026-11-28) and with the sizes known (every later
        // round); GB/s of the bytes each rank receives (one rank: the copy)
        const size_t bucket = 6132512;
        DeviceBuffer<std::byte> bucket_in(bucket), bucket_out(bucket * W);
        CUDA_CHECK(cudaMemset(bucket_in.data(), 0, bucket));
        std::vector<size_t> bucket_offsets;
        float gather_ms[2] = {0.0f, 0.0f};
        for (const GatherSizes how : {GatherSizes::exchange, GatherSizes::equal}) {
            const int i = how == GatherSizes::equal;
            gather_ms[i] = check::time_ms(env.stream, 20, [&] {
                t.allgather_device(std::span<const std::byte>(bucket_in.data(), bucket), bucket_out.data(),
                                   bucket_out.size(), bucket_offsets, how);
            });
            if (r == 0)
                check::report_bandwidth(i ? "allgather_device 6.1 MB, sizes known" : "allgather_device 6.1 MB, size exchange",
                                        gather_ms[i], double(bucket) * std::max(W - 1, 1));
        }
        if (r == 0) check::report_ratio("allgather_device sizes known / size exchange", gather_ms[1], gather_ms[0]);
#endif

        std::printf("rank %d: %s\n", r, ck.failures == 0 ? "PASS" : "FAIL");
        const int rc = ck.failures == 0 ? 0 : 1;
        return rc;
    } catch (const std::exception& e) {
        std::printf("error: %s\nFAIL\n", e.what());
        if (world && world->world_size() > 1) world->abort(1);
        return 1;
    }
}
