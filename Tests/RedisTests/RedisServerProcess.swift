import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A real `redis-server` on a free loopback port, for one test; stopped by `stop()`.
final class RedisServerProcess: @unchecked Sendable {
    let port: Int
    private var pid: pid_t = 0
    private let extraArguments: [String]

    init(port: Int? = nil, arguments: [String] = []) throws {
        self.port = try port ?? Self.freePort()
        self.extraArguments = arguments
        try start()
    }

    /// Starts (again, on the same port) and waits for "Ready to accept connections".
    func start() throws {
        let arguments = ["redis-server", "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                         "--enable-debug-command", "yes", "--loglevel", "notice"] + extraArguments
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw Failure.didNotStart("pipe") }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 2)
        posix_spawn_file_actions_addclose(&actions, fds[0])
        defer { posix_spawn_file_actions_destroy(&actions) }
        // The test process may ignore SIGTERM (signal handling of other suites); children would
        // inherit that. Spawn with default dispositions and nothing blocked.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigfillset(&defaults)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK))
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        guard posix_spawn(&pid, "/usr/bin/redis-server", &actions, &attributes, &argv, environ) == 0 else { throw Failure.didNotStart("spawn") }
        close(fds[1])
        let reader = fds[0]
        var seen = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !seen.contains("Ready to accept connections") {
            let n = read(reader, &chunk, chunk.count)
            guard n > 0 else { close(reader); throw Failure.didNotStart(seen) }
            seen += String(decoding: chunk[0..<n], as: UTF8.self)
        }
        // Keep draining its output so the pipe never fills; ends when the server exits.
        Thread {
            var sink = [UInt8](repeating: 0, count: 4096)
            while read(reader, &sink, sink.count) > 0 {}
            close(reader)
        }.start()
    }

    /// Stops the server and waits until it has exited (its port is free again).
    func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        pid = 0
    }

    deinit { stop() }

    enum Failure: Error { case didNotStart(String) }

    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        return Int(UInt16(bigEndian: addr.sin_port))
    }
}
