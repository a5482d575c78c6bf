import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A real `redis-server` on a free loopback port, for one test; stopped by `stop()`. It serves
/// plain TCP, TLS only (`tls`), or runs as a sentinel (`sentinelConfigFile`).
public final class RedisServerProcess: @unchecked Sendable {
    /// The port it listens on: the TLS port with `tls`.
    public private(set) var port: Int
    private var pid: pid_t = 0
    private let extraArguments: [String]
    private let tls: TLS?
    private let sentinelConfigFile: String?

    /// TLS on `port` and no plain TCP port (`--port 0 --tls-port …`).
    public struct TLS: Sendable {
        public var certificateFile: String
        public var privateKeyFile: String
        /// The CA clients' certificates must chain to (also required by redis-server when no
        /// client is asked for one).
        public var caFile: String
        /// `tls-auth-clients yes`: a client without a certificate from `caFile` is refused.
        public var authClients: Bool

        public init(certificateFile: String, privateKeyFile: String, caFile: String, authClients: Bool = false) {
            self.certificateFile = certificateFile
            self.privateKeyFile = privateKeyFile
            self.caFile = caFile
            self.authClients = authClients
        }
    }

    /// Without a `port`, a free one is chosen — and another, should a parallel test take it
    /// between the choice and redis-server's bind (seen in full runs).
    /// - Parameter sentinelConfigFile: run as a sentinel (`redis-server <file> --sentinel`); the
    ///   file must be writable (the sentinel rewrites it).
    public init(port: Int? = nil, arguments: [String] = [], tls: TLS? = nil, sentinelConfigFile: String? = nil) throws {
        self.extraArguments = arguments
        self.tls = tls
        self.sentinelConfigFile = sentinelConfigFile
        self.port = try port ?? closedPort()
        for attempt in 1...5 {
            do {
                try start()
                return
            } catch Failure.didNotStart(let output) where port == nil && attempt < 5 && output.contains("Address already in use") {
                stop()
                self.port = try closedPort()
            }
        }
    }

    /// Starts (again, on the same port) and waits until it listens: "Ready to accept
    /// connections" (a sentinel: its "+monitor" line, logged once it listens).
    public func start() throws {
        var arguments = ["redis-server"]
        var ready = "Ready to accept connections"
        if let sentinelConfigFile {
            arguments += [sentinelConfigFile, "--sentinel"]
            ready = "+monitor master"
        }
        if let tls {
            arguments += ["--port", "0", "--tls-port", String(port), "--tls-cert-file", tls.certificateFile, "--tls-key-file", tls.privateKeyFile,
                          "--tls-ca-cert-file", tls.caFile, "--tls-auth-clients", tls.authClients ? "yes" : "no"]
        } else {
            arguments += ["--port", String(port)]
        }
        // A replica writes the snapshot it syncs from its master even with `--save ""`: in the
        // temporary directory, one file per port, never in the checkout.
        arguments += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--enable-debug-command", "yes", "--loglevel", "notice",
                      "--dir", NSTemporaryDirectory(), "--dbfilename", snapshotFile] + extraArguments
        guard let spawned = spawnWithOutputPipe("/usr/bin/redis-server", arguments) else { throw Failure.didNotStart("spawn") }
        pid = spawned.pid
        Self.register(pid)
        let reader = spawned.reader
        var seen = ""
        var chunk = [UInt8](repeating: 0, count: 4096)
        while !seen.contains(ready) {
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

    /// The snapshot a replica writes (in the temporary directory), removed at `stop()`.
    private var snapshotFile: String { "sessiongate-test-\(port).rdb" }

    /// Stops the server and waits until it has exited (its port is free again).
    public func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGCONT)  // a frozen server must be able to exit
        kill(pid, SIGTERM)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        Self.unregister(pid)
        pid = 0
        unlink(NSTemporaryDirectory() + snapshotFile)
    }

    /// Kills the server (SIGKILL: a crash, nothing flushed or handed over) and waits until it
    /// has exited.
    public func crash() {
        guard pid > 0 else { return }
        kill(pid, SIGKILL)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        Self.unregister(pid)
        pid = 0
    }

    /// Every server this process started, killed at exit: a test that ends without stopping
    /// its server (a `defer { Task { … } }` that never ran) leaves no orphan behind.
    private static let running = NSLock()
    nonisolated(unsafe) private static var pids: Set<pid_t> = []
    nonisolated(unsafe) private static var registered = false

    private static func register(_ pid: pid_t) {
        running.lock()
        defer { running.unlock() }
        pids.insert(pid)
        if !registered {
            registered = true
            atexit {
                RedisServerProcess.running.lock()
                for pid in RedisServerProcess.pids { kill(pid, SIGKILL) }
                RedisServerProcess.running.unlock()
            }
        }
    }

    private static func unregister(_ pid: pid_t) {
        running.lock()
        pids.remove(pid)
        running.unlock()
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    public func freeze() { if pid > 0 { kill(pid, SIGSTOP) } }
    public func thaw() { if pid > 0 { kill(pid, SIGCONT) } }

    deinit { stop() }

    public enum Failure: Error { case didNotStart(String) }
}

/// A Redis for tests that only need one: `REDIS_URL` when set (CI may provide one), else a
/// `redis-server` of our own. Tests sharing an external Redis use a unique key prefix each.
public struct TestRedis: Sendable {
    public let host: String
    public let port: Int
    public let database: Int
    /// Ours to stop; nil for `REDIS_URL`.
    public let process: RedisServerProcess?

    public init(host: String, port: Int, database: Int, process: RedisServerProcess?) {
        self.host = host
        self.process = process
        self.port = process?.port ?? port
        self.database = database
    }

    public static func start() throws -> TestRedis {
        if let url = ProcessInfo.processInfo.environment["REDIS_URL"], url.hasPrefix("redis://") {
            var rest = url.dropFirst("redis://".count)
            if let at = rest.lastIndex(of: "@") { rest = rest[rest.index(after: at)...] }
            var database = 0
            if let slash = rest.firstIndex(of: "/") {
                database = Int(rest[rest.index(after: slash)...]) ?? 0
                rest = rest[..<slash]
            }
            let parts = rest.split(separator: ":")
            return TestRedis(host: String(parts.first ?? "127.0.0.1"), port: parts.count > 1 ? Int(parts[1]) ?? 6379 : 6379, database: database, process: nil)
        }
        let process = try RedisServerProcess()
        return TestRedis(host: "127.0.0.1", port: process.port, database: 0, process: process)
    }

    public func stop() { process?.stop() }

    /// A key prefix no other test uses.
    public static func uniquePrefix() -> String { "sgtest:\(UInt64.random(in: 0 ... .max)):" }
}

/// A port nothing listens on (bound, then closed).
public func closedPort() throws -> Int {
    let (fd, port) = boundLoopbackSocket()
    close(fd)
    return port
}

/// A loopback port held for a server that binds it later with `SO_REUSEADDR` (the gateway: NIO's
/// `ServerBootstrap` here), for as long as the value lives. A socket bound with `SO_REUSEADDR`
/// and never listening keeps every other bind off the port — another test asking the kernel
/// for a free one — yet lets that server listen on it. A `closedPort()` was free when chosen,
/// and once in ~30 full runs another test's server took it before the gateway started
/// ("address already in use").
public final class ReservedPort: @unchecked Sendable {
    public let port: Int
    private let fd: Int32
    public init() {
        (fd, port) = boundLoopbackSocket(reuseAddress: true)
    }
    deinit { close(fd) }
}

/// A loopback port that refuses connections for as long as the value lives: a socket bound to
/// it and never listening holds the port, so no other test's server can take it meanwhile (a
/// `closedPort()` was seen answering as another test's listener in a full run).
public final class RefusingPort: @unchecked Sendable {
    public let port: Int
    private let fd: Int32
    public init() {
        (fd, port) = boundLoopbackSocket()
    }
    deinit { close(fd) }
}

/// A TCP socket bound to a free loopback port (not listening yet): its descriptor and port.
public func boundLoopbackSocket(reuseAddress: Bool = false) -> (fd: Int32, port: Int) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    if reuseAddress {
        var one: Int32 = 1
        _ = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = 0
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return (fd, Int(UInt16(bigEndian: addr.sin_port)))
}

/// Runs a program to completion (posix_spawn + waitpid: Foundation's Process can miss the exit
/// of a child that daemonizes) with default signal dispositions; its exit status.
public func runToCompletion(_ path: String, _ arguments: [String]) -> Int32 {
    let pid = spawnWithDefaultSignals(path, [path] + arguments, fileActions: nil)
    guard pid > 0 else { return -1 }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    return (status >> 8) & 0xff
}

/// Runs a program to completion as `runToCompletion` does, its standard output and error
/// captured (read to the end, so the child never blocks on a full pipe): its exit status and
/// that output.
public func runCapturingOutput(_ path: String, _ arguments: [String]) -> (status: Int32, output: String) {
    guard let (pid, reader) = spawnWithOutputPipe(path, [path] + arguments).map({ ($0.pid, $0.reader) }) else { return (-1, "spawn \(path)") }
    defer { close(reader) }
    var output: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = read(reader, &chunk, chunk.count)
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else { break }
        output += chunk[0..<n]
    }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    return ((status >> 8) & 0xff, String(decoding: output, as: UTF8.self))
}

/// posix_spawn with default signal dispositions and nothing blocked: the test process may
/// ignore SIGTERM (signal handling of other suites), and children would inherit that.
/// `arguments` includes argv[0]. Returns the pid, or 0.
///
/// The child keeps only standard input, output and error: every other descriptor is closed in
/// it. Without that, a long-lived child (a redis-server of a Sentinel cluster) inherits the
/// write end of whatever pipe another test had open at that moment — an `openssl` run whose
/// output is read to EOF then never ends while the child lives, and with both cooperative
/// threads blocked so, nothing stops the child: the whole run hung (about one run in three).
func spawnWithDefaultSignals(_ path: String, _ arguments: [String], fileActions: UnsafeMutablePointer<posix_spawn_file_actions_t>?) -> pid_t {
    guard let fileActions else {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        return spawnWithDefaultSignals(path, arguments, fileActions: &actions)
    }
    guard closeFrom(fileActions, 3) == 0 else { return 0 }
    return spawn(path, arguments, actions: fileActions)
}

/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later; Swift's Glibc module
/// does not declare it), looked up once.
private let closeFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32 = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
        fatalError("glibc 2.34 or later is needed: posix_spawn_file_actions_addclosefrom_np is missing")
    }
    return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32).self)
}()

private func spawn(_ path: String, _ arguments: [String], actions: UnsafeMutablePointer<posix_spawn_file_actions_t>) -> pid_t {
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
    var pid: pid_t = 0
    guard posix_spawn(&pid, path, actions, &attributes, &argv, environ) == 0 else { return 0 }
    return pid
}

/// Spawns `path` with `arguments` (the first is the program's name) and its standard output and
/// error on one pipe: its pid and the pipe's reading end (the caller's to drain and close); nil
/// when it could not be spawned.
func spawnWithOutputPipe(_ path: String, _ arguments: [String]) -> (pid: pid_t, reader: Int32)? {
    var fds: [Int32] = [0, 0]
    guard pipe(&fds) == 0 else { return nil }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2)
    posix_spawn_file_actions_addclose(&actions, fds[0])
    defer { posix_spawn_file_actions_destroy(&actions) }
    let pid = spawnWithDefaultSignals(path, arguments, fileActions: &actions)
    close(fds[1])
    guard pid > 0 else {
        close(fds[0])
        return nil
    }
    return (pid, fds[0])
}
