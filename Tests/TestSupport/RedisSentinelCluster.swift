import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Redis Sentinel on loopback for one test: a master, its replica and three sentinels
/// (quorum 2, `down-after-milliseconds` 1000, `failover-timeout` 5000), every process on a free
/// port. Ready when constructed: the replica is in sync and every sentinel knows the replica
/// and the two other sentinels, so a failover can be authorised. `stop()` ends all of them
/// (and the exit handler of `RedisServerProcess` any that a failed test left behind). Its
/// start-up blocks for seconds: make it with `blocking { try RedisSentinelCluster() }`.
public final class RedisSentinelCluster: @unchecked Sendable {
    public let masterName: String
    /// The data servers: `[0]` the first master, `[1]` its replica.
    public let servers: [RedisServerProcess]
    public let sentinels: [RedisServerProcess]
    public var sentinelPorts: [Int] { sentinels.map(\.port) }
    private let directory: String

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    public init(masterName: String = "mymaster", within limit: TimeInterval = 30) throws {
        self.masterName = masterName
        directory = NSTemporaryDirectory() + "sessiongate-sentinel-\(UInt64.random(in: 0 ... .max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let deadline = Date().addingTimeInterval(limit)
        var started: [RedisServerProcess] = []
        do {
            let master = try RedisServerProcess()
            started.append(master)
            let replica = try RedisServerProcess(arguments: ["--replicaof", "127.0.0.1", String(master.port)])
            started.append(replica)
            servers = [master, replica]
            // In sync before the sentinels start: their first INFO of the master then names the replica.
            try Self.poll(until: deadline, "the replica of \(master.port) syncs") {
                Self.info(port: replica.port)["master_link_status"] == "up"
            }
            var sentinels: [RedisServerProcess] = []
            for index in 0..<3 {
                let file = directory + "/sentinel-\(index).conf"
                try """
                    sentinel monitor \(masterName) 127.0.0.1 \(master.port) 2
                    sentinel down-after-milliseconds \(masterName) 1000
                    sentinel failover-timeout \(masterName) 5000

                    """.write(toFile: file, atomically: true, encoding: .utf8)
                let sentinel = try RedisServerProcess(sentinelConfigFile: file)
                started.append(sentinel)
                sentinels.append(sentinel)
            }
            self.sentinels = sentinels
            // Sentinels find each other through the master's hello channel (every 2 s).
            for sentinel in sentinels {
                try Self.poll(until: deadline, "sentinel \(sentinel.port) knows the replica and the other sentinels") {
                    guard case .array(let replicas)? = try? RedisCommand.send(["SENTINEL", "replicas", masterName], port: sentinel.port),
                          case .array(let peers)? = try? RedisCommand.send(["SENTINEL", "sentinels", masterName], port: sentinel.port) else { return false }
                    return replicas.count == 1 && peers.count == 2
                }
            }
        } catch {
            started.forEach { $0.stop() }
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// The master's port as the first sentinel that answers names it.
    public func reportedMasterPort() -> Int? {
        for port in sentinelPorts {
            if case .array(let parts)? = try? RedisCommand.send(["SENTINEL", "get-master-addr-by-name", masterName], port: port),
               parts.count == 2, let value = parts[1].string, let master = Int(value) {
                return master
            }
        }
        return nil
    }

    /// The data server listening on `port`.
    public func server(on port: Int) -> RedisServerProcess? { servers.first { $0.port == port } }

    /// Waits until the replica has every write the master has (replication is asynchronous:
    /// a write not yet replicated is lost in a failover).
    public func waitForReplication(within limit: Duration = .seconds(10)) async throws {
        guard let master = reportedMasterPort(), let replica = servers.first(where: { $0.port != master }) else {
            throw Failure(description: "no master reported")
        }
        guard let offset = Self.info(port: master)["master_repl_offset"].flatMap({ Int($0) }) else {
            throw Failure(description: "no replication offset from \(master)")
        }
        try await Self.poll(within: limit, "the replica \(replica.port) reaches offset \(offset)") {
            (Self.info(port: replica.port)["slave_repl_offset"].flatMap { Int($0) } ?? -1) >= offset
        }
    }

    /// Kills (SIGKILL) the master the sentinels name; its port.
    @discardableResult
    public func crashMaster() throws -> Int {
        guard let port = reportedMasterPort(), let master = server(on: port) else { throw Failure(description: "no master reported") }
        master.crash()
        return port
    }

    /// Freezes (SIGSTOP) the master the sentinels name, as a network partition would look:
    /// connections stay open, nothing is answered. Its port.
    @discardableResult
    public func freezeMaster() throws -> Int {
        guard let port = reportedMasterPort(), let master = server(on: port) else { throw Failure(description: "no master reported") }
        master.freeze()
        return port
    }

    /// Polls the sentinels (every 50 ms) until one names a master other than `old`: its port,
    /// and when that was first seen.
    public func waitForNewMaster(replacing old: Int, within limit: Duration = .seconds(30)) async throws -> (port: Int, seen: ContinuousClock.Instant) {
        var found: Int?
        try await Self.poll(within: limit, every: .milliseconds(50), "the sentinels name a master other than \(old)") {
            found = self.reportedMasterPort().flatMap { $0 == old ? nil : $0 }
            return found != nil
        }
        return (found!, .now)
    }

    /// Polls until every sentinel names `port` as the master (the others learn a failover from
    /// the leader's hello messages, each announcing `+switch-master` as it does).
    public func waitUntilAllSentinelsName(_ port: Int, within limit: Duration = .seconds(15)) async throws {
        try await Self.poll(within: limit, "every sentinel names \(port)") {
            self.sentinelPorts.allSatisfy { sentinel in
                guard case .array(let parts)? = try? RedisCommand.send(["SENTINEL", "get-master-addr-by-name", self.masterName], port: sentinel),
                      parts.count == 2 else { return false }
                return parts[1].string == String(port)
            }
        }
    }

    /// How many connections are subscribed to something on the sentinels (`CLIENT LIST`
    /// `sub=`): the sentinels keep none of their own, so these are the tests' watchers.
    public func sentinelSubscriptions() -> Int {
        sentinelPorts.reduce(0) { total, port in
            guard let list = (try? RedisCommand.send(["CLIENT", "LIST"], port: port))?.string else { return total }
            return total + list.split(whereSeparator: \.isNewline).filter { !$0.contains(" sub=0 ") }.count
        }
    }

    public func stop() {
        (sentinels + servers).forEach { $0.stop() }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// `INFO` as key/value pairs (empty when the server does not answer).
    public static func info(port: Int) -> [String: String] {
        guard let text = (try? RedisCommand.send(["INFO"], port: port))?.string else { return [:] }
        var values: [String: String] = [:]
        for line in text.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        return values
    }

    private static func poll(until deadline: Date, _ what: String, _ condition: () -> Bool) throws {
        while !condition() {
            guard Date() < deadline else { throw Failure(description: "timed out waiting until \(what)") }
            usleep(50_000)  // an external process: nothing to await
        }
    }

    private static func poll(within limit: Duration, every interval: Duration = .milliseconds(50), _ what: String,
                             _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + limit
        while !condition() {
            guard ContinuousClock.now < deadline else { throw Failure(description: "timed out after \(limit) waiting until \(what)") }
            try await Task.sleep(for: interval)
        }
    }
}

/// A blocking one-command Redis client over plain TCP on loopback, for tests to drive and
/// inspect their servers (not the code under test).
public enum RedisCommand {
    public indirect enum Reply: Equatable, Sendable {
        case string(String)
        case error(String)
        case integer(Int)
        case null
        case array([Reply])

        public var string: String? { if case .string(let s) = self { return s } else { return nil } }
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Sends `arguments` to `127.0.0.1:port` on a new connection; the reply (seconds at most).
    public static func send(_ arguments: [String], port: Int, timeout seconds: Int = 2) throws -> Reply {
        var request = "*\(arguments.count)\r\n"
        for argument in arguments { request += "$\(argument.utf8.count)\r\n\(argument)\r\n" }
        do {
            let client = try RawClient(port: port, timeoutSeconds: seconds)
            try client.send(request)
            return try reply(client)
        } catch RawClient.Failure.connect(let code) {
            throw Failure(description: "connect to \(port): \(String(cString: strerror(code)))")
        } catch let failure as RawClient.Failure {
            throw Failure(description: "\(port): \(failure)")
        }
    }

    private static func reply(_ client: RawClient) throws -> Reply {
        let header = try client.readLine()
        let rest = String(header.dropFirst())
        switch header.first {
        case "+": return .string(rest)
        case "-": return .error(rest)
        case ":": return .integer(Int(rest) ?? 0)
        case "$":
            let length = Int(rest) ?? -1
            return length < 0 ? .null : .string(String(decoding: try client.read(count: length + 2).dropLast(2), as: UTF8.self))
        case "*":
            let count = Int(rest) ?? -1
            return count < 0 ? .null : .array(try (0..<count).map { _ in try reply(client) })
        default:
            throw Failure(description: "not RESP: \(header.prefix(40))")
        }
    }
}
