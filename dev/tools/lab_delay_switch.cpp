// lab_delay_switch: the bandwidth lab's switch when its links have a delay (scripts/bandwidth_lab.sh --delay).
// The kernel here has tbf but no netem, so the lab cannot add latency with tc. Instead of a bridge, this program
// runs in the switch namespace with one packet socket per host port (p0, p1, ...): it learns which port each
// MAC address sits behind, holds every frame for the one-way delay, then sends it out of the destination port
// (broadcasts and unknown destinations to every other port), where the port's tbf qdisc still limits the rate.
// A frame therefore takes D from one host to another and a round trip takes 2 D, on top of the tbf queues.
//
//   build/lab_delay_switch --delay_us 20000 --ports p0,p1,p2 [--ready FILE]
//
// Frames keep their offload state (PACKET_VNET_HDR: TCP's 64 KB GSO frames and their unfinished checksums
// travel as they came, as through a bridge). Frames a full qdisc refuses are dropped, as a switch drops them;
// TCP resends them. SIGTERM / SIGINT end it (the lab's teardown kills every process in its namespaces); on
// exit it prints how many frames it forwarded, flooded and dropped.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmc/base/error.h"

namespace {

// The frame buffer: a GSO frame is at most 64 KB plus its headers (BIG TCP, off by default, would need more).
constexpr size_t kMaxFrame = 256 * 1024;
constexpr int kSocketBuffer = 64 << 20;  // deep enough that only the qdisc, never the socket, drops a frame
// struct virtio_net_hdr (flags, gso_type, hdr_len, gso_size, csum_start, csum_offset) in front of every frame
// with PACKET_VNET_HDR; only its size matters here (linux/virtio_net.h does not compile as C++).
constexpr size_t kVnetHeader = 10;

volatile sig_atomic_t g_stop = 0;  // set by the signal handler; the only state a handler may touch
void on_stop_signal(int) { g_stop = 1; }

int64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

struct Port {
    std::string name;
    int fd = -1;
};

struct HeldFrame {
    int64_t due_ns;
    int from_port;
    std::vector<uint8_t> bytes;  // virtio_net_hdr, then the Ethernet frame
};

struct Counts {
    uint64_t forwarded = 0, flooded = 0, dropped_full = 0, dropped_other = 0, truncated = 0;
};

class DelaySwitch {
public:
    DelaySwitch(std::vector<std::string> names, int64_t delay_ns) : delay_ns_(delay_ns) {
        for (auto& name : names) ports_.push_back(Port{name, open_port(name)});
    }
    ~DelaySwitch() {
        for (auto& p : ports_)
            if (p.fd >= 0) close(p.fd);
    }
    DelaySwitch(const DelaySwitch&) = delete;
    DelaySwitch& operator=(const DelaySwitch&) = delete;

    void run(const sigset_t& wait_mask) {
        std::vector<pollfd> fds;
        for (auto& p : ports_) fds.push_back(pollfd{p.fd, POLLIN, 0});
        std::vector<uint8_t> buffer(kMaxFrame);
        while (!g_stop) {
            int64_t now = now_ns();
            while (!held_.empty() && held_.front().due_ns <= now) {
                deliver(held_.front());
                held_.pop_front();
            }
            int64_t wait_ns = held_.empty() ? 100000000 : held_.front().due_ns - now;
            timespec timeout{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
            int ready = ppoll(fds.data(), fds.size(), &timeout, &wait_mask);
            if (ready < 0) {
                LLMC_CHECK(errno == EINTR, std::string("lab_delay_switch: poll failed: ") + std::strerror(errno));
                continue;
            }
            for (size_t i = 0; i < fds.size(); i++)
                if (fds[i].revents & POLLIN) receive_all(static_cast<int>(i), buffer);
        }
    }

    const Counts& counts() const { return counts_; }

private:
    static int open_port(const std::string& name) {
        unsigned index = if_nametoindex(name.c_str());
        LLMC_CHECK(index != 0, "lab_delay_switch: no interface '" + name + "' in this namespace");
        int fd = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
        LLMC_CHECK(fd >= 0, std::string("lab_delay_switch: cannot open a packet socket (needs root): ") +
                                std::strerror(errno));
        int on = 1;
        LLMC_CHECK(setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &on, sizeof on) == 0,
                   std::string("lab_delay_switch: PACKET_VNET_HDR refused: ") + std::strerror(errno));
        // Our own sends on a port would otherwise come back to its socket as outgoing frames.
        LLMC_CHECK(setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &on, sizeof on) == 0,
                   std::string("lab_delay_switch: PACKET_IGNORE_OUTGOING refused (kernel < 4.20?): ") +
                       std::strerror(errno));
        int size = kSocketBuffer;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);  // best effort: the defaults still work
        setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size);
        sockaddr_ll address{};
        address.sll_family = AF_PACKET;
        address.sll_protocol = htons(ETH_P_ALL);
        address.sll_ifindex = static_cast<int>(index);
        LLMC_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0,
                   "lab_delay_switch: cannot bind to '" + name + "': " + std::strerror(errno));
        return fd;
    }

    static uint64_t mac_key(const uint8_t* mac) {
        uint64_t key = 0;
        std::memcpy(&key, mac, 6);
        return key;
    }

    void receive_all(int port, std::vector<uint8_t>& buffer) {
        for (;;) {
            ssize_t n = recv(ports_[port].fd, buffer.data(), buffer.size(), MSG_DONTWAIT | MSG_TRUNC);
            if (n < 0) {
                LLMC_CHECK(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR,
                           "lab_delay_switch: receive on '" + ports_[port].name + "' failed: " +
                               std::strerror(errno));
                return;
            }
            if (static_cast<size_t>(n) > buffer.size()) {
                counts_.truncated++;
                continue;
            }
            if (static_cast<size_t>(n) < kVnetHeader + ETH_HLEN) continue;
            const uint8_t* frame = buffer.data() + kVnetHeader;
            if (!(frame[6] & 1)) mac_of_[mac_key(frame + 6)] = port;  // learn the sender's port
            held_.push_back(HeldFrame{now_ns() + delay_ns_, port, std::vector<uint8_t>(buffer.data(),
                                                                                       buffer.data() + n)});
        }
    }

    void send_to(int port, const std::vector<uint8_t>& bytes) {
        if (send(ports_[port].fd, bytes.data(), bytes.size(), 0) >= 0) return;
        if (errno == ENOBUFS || errno == EAGAIN)
            counts_.dropped_full++;  // the port's qdisc is full: a switch drops the frame too
        else if (counts_.dropped_other++ == 0)
            std::fprintf(stderr, "lab_delay_switch: send on '%s' failed: %s (further failures only counted)\n",
                         ports_[port].name.c_str(), std::strerror(errno));
    }

    void deliver(const HeldFrame& held) {
        const uint8_t* destination = held.bytes.data() + kVnetHeader;
        if (!(destination[0] & 1)) {
            auto known = mac_of_.find(mac_key(destination));
            if (known != mac_of_.end()) {
                if (known->second != held.from_port) send_to(known->second, held.bytes);
                counts_.forwarded++;
                return;
            }
        }
        for (int p = 0; p < static_cast<int>(ports_.size()); p++)
            if (p != held.from_port) send_to(p, held.bytes);
        counts_.flooded++;
    }

    int64_t delay_ns_;
    std::vector<Port> ports_;
    std::unordered_map<uint64_t, int> mac_of_;
    std::deque<HeldFrame> held_;  // in arrival order, which is also due order: every frame waits the same delay
    Counts counts_;
};

std::vector<std::string> split_names(const std::string& list) {
    std::vector<std::string> names;
    size_t start = 0;
    while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        std::string name = list.substr(start, comma - start);
        LLMC_CHECK(!name.empty() && name.size() < IFNAMSIZ, "--ports: bad interface name '" + name + "' in '" +
                                                                 list + "'");
        names.push_back(name);
        start = comma + 1;
    }
    return names;
}

int run(int argc, char** argv) {
    long long delay_us = -1;
    std::string ports, ready_file;
    for (int i = 1; i < argc; i++) {
        std::string flag = argv[i];
        LLMC_CHECK(i + 1 < argc, flag + " needs a value (usage: lab_delay_switch --delay_us N --ports p0,p1 "
                                        "[--ready FILE])");
        std::string value = argv[++i];
        if (flag == "--delay_us") {
            size_t used = 0;
            try {
                delay_us = std::stoll(value, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            LLMC_CHECK(used == value.size() && delay_us >= 0 && delay_us <= 10000000,
                       "--delay_us expects microseconds from 0 to 10000000, got '" + value + "'");
        } else if (flag == "--ports") {
            ports = value;
        } else if (flag == "--ready") {
            ready_file = value;
        } else {
            llmc::fail("unknown flag '" + flag + "' (usage: lab_delay_switch --delay_us N --ports p0,p1 "
                       "[--ready FILE])");
        }
    }
    LLMC_CHECK(delay_us >= 0 && !ports.empty(), "usage: lab_delay_switch --delay_us N --ports p0,p1 [--ready FILE]");

    // SIGTERM / SIGINT stay blocked except inside ppoll, so a stop never lands between the check and the wait.
    sigset_t stop_signals, wait_mask;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    sigprocmask(SIG_BLOCK, &stop_signals, &wait_mask);
    sigdelset(&wait_mask, SIGTERM);
    sigdelset(&wait_mask, SIGINT);
    struct sigaction action{};
    action.sa_handler = on_stop_signal;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);

    DelaySwitch lab_switch(split_names(ports), delay_us * 1000);
    if (!ready_file.empty()) {
        std::ofstream ready(ready_file);
        LLMC_CHECK(ready.good(), ready_file + ": cannot write the ready file");
        ready << "ready\n";
    }
    lab_switch.run(wait_mask);
    const Counts& c = lab_switch.counts();
    std::fprintf(stderr,
                 "lab_delay_switch: %llu frames forwarded, %llu flooded, %llu dropped at a full queue, "
                 "%llu failed, %llu too large\n",
                 static_cast<unsigned long long>(c.forwarded), static_cast<unsigned long long>(c.flooded),
                 static_cast<unsigned long long>(c.dropped_full), static_cast<unsigned long long>(c.dropped_other),
                 static_cast<unsigned long long>(c.truncated));
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::main_reporting_errors(argc, argv, run); }
