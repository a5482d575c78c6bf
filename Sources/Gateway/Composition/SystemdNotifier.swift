#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// The service manager's notification protocol (`sd_notify(3)`, `Type=notify` units): one
/// datagram per state change to the Unix socket named by `NOTIFY_SOCKET` (a path, or an abstract
/// name when it starts with `@`). Without the variable (not under systemd) every call does
/// nothing. Lines sent:
/// - `READY=1` once listening and the store has answered (or the documented degraded start),
/// - `RELOADING=1` and `MONOTONIC_USEC=` when a reload starts, `READY=1` and `STATUS=` with its
///   outcome when it ends,
/// - `STATUS=` when the session store stops or starts answering,
/// - `STOPPING=1` when draining starts.
struct SystemdNotifier: Sendable {
    private let address: String?

    init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        address = environment["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
    }

    func ready(status: String) { send("READY=1\nSTATUS=\(status)") }

    func reloading() {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        send("RELOADING=1\nMONOTONIC_USEC=\(UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000)")
    }

    func stopping() { send("STOPPING=1\nSTATUS=draining in-flight requests") }

    /// What the service manager shows (`systemctl status`): the store's state when it changes.
    func status(_ status: String) { send("STATUS=\(status)") }

    /// One datagram; a failure is not the gateway's problem (the manager went away).
    private func send(_ message: String) {
        guard let address else { return }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        var path = Array(address.utf8)
        if path.first == UInt8(ascii: "@") { path[0] = 0 }  // abstract namespace
        let capacity = MemoryLayout.size(ofValue: sun.sun_path)
        guard path.count < capacity else { return }
        withUnsafeMutableBytes(of: &sun.sun_path) { raw in
            for (i, byte) in path.enumerated() { raw[i] = byte }
        }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + path.count)
        _ = message.withCString { text in
            withUnsafePointer(to: &sun) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sendto(fd, text, strlen(text), 0, $0, length) }
            }
        }
    }
}
