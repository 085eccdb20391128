// llmc/base/host_memory.h: large allocations are 2 MiB aligned and carry the kernel's huge-page advice (the "hg" flag
// in /proc/self/smaps, read back here, not taken on trust), small ones are 64-byte aligned, and LargeVector
// behaves as a std::vector. Where the kernel lends huge pages (transparent_hugepage not "never"), the touched
// large array is backed by them (AnonHugePages in smaps).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "llmc/base/host_memory.h"
#include "test/support/testing.h"

namespace {

// The smaps fields of the mapping that holds `p`: its VmFlags line and its AnonHugePages in kB.
struct Mapping {
    bool found = false;
    std::string flags;
    long anon_huge_kb = 0;
};
Mapping mapping_of(const void* p) {
    std::ifstream smaps("/proc/self/smaps");
    const auto address = reinterpret_cast<uintptr_t>(p);
    Mapping m;
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
        unsigned long begin = 0, end = 0;
        char dash = 0;
        std::istringstream header(line);
        if (header >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
            if (m.found) break;  // the next mapping's header
            inside = address >= begin && address < end;
            m.found = inside;
            continue;
        }
        if (!inside) continue;
        if (line.starts_with("VmFlags:")) m.flags = line.substr(8);
        if (line.starts_with("AnonHugePages:")) m.anon_huge_kb = std::stol(line.substr(14));
    }
    return m;
}

// The kernel's transparent-huge-page mode ("always [madvise] never"); empty for a kernel without them, which
// refuses the advice (and the flag checks below then have nothing to check).
std::string huge_page_mode() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
bool advice_taken() { return !huge_page_mode().empty(); }
bool huge_pages_lent() { return advice_taken() && huge_page_mode().find("[never]") == std::string::npos; }

}  // namespace

TEST(small_allocations_are_plain_and_64_byte_aligned) {
    for (size_t bytes : {size_t{1}, size_t{100}, size_t{4096}, llmc::kHugePageBytes - 1}) {
        void* p = llmc::allocate_large(bytes);
        EXPECT(p != nullptr);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, uintptr_t{0});
        std::memset(p, 1, bytes);
        std::free(p);
    }
}

TEST(large_allocations_are_advised_huge_pages) {
    const size_t bytes = 3 * llmc::kHugePageBytes + 123;
    auto* p = static_cast<char*>(llmc::allocate_large(bytes));
    EXPECT(p != nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % llmc::kHugePageBytes, uintptr_t{0});
    std::memset(p, 7, bytes);
    const Mapping m = mapping_of(p);
    EXPECT(m.found);
    std::printf("  VmFlags:%s, AnonHugePages %ld kB\n", m.flags.c_str(), m.anon_huge_kb);
    if (advice_taken()) EXPECT(m.flags.find(" hg") != std::string::npos);
    if (huge_pages_lent()) EXPECT(m.anon_huge_kb >= 2048);
    std::free(p);
}

TEST(large_vector_is_a_zeroed_vector_on_huge_pages) {
    llmc::LargeVector<float> v(3 * llmc::kHugePageBytes / sizeof(float), 0.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % llmc::kHugePageBytes, uintptr_t{0});
    bool zero = true;
    for (float x : v) zero = zero && x == 0.0f;
    EXPECT(zero);
    if (advice_taken()) EXPECT(mapping_of(v.data()).flags.find(" hg") != std::string::npos);
    v.assign(10, 2.5f);  // shrinks like a std::vector
    EXPECT_EQ(v.size(), size_t{10});
    const llmc::LargeVector<float> copy = v;
    EXPECT(copy == v);
}

TEST_MAIN()
