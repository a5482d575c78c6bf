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
            try Poll.until(deadline, "the replica of \(master.port) syncs") {
                RedisCommand.info(port: replica.port)["master_link_status"] == "up"
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
                try Poll.until(deadline, "sentinel \(sentinel.port) knows the replica and the other sentinels") {
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
        guard let offset = RedisCommand.info(port: master)["master_repl_offset"].flatMap({ Int($0) }) else {
            throw Failure(description: "no replication offset from \(master)")
        }
        try await Poll.within(limit, "the replica \(replica.port) reaches offset \(offset)") {
            (RedisCommand.info(port: replica.port)["slave_repl_offset"].flatMap { Int($0) } ?? -1) >= offset
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
        try await Poll.within(limit, every: .milliseconds(50), "the sentinels name a master other than \(old)") {
            found = self.reportedMasterPort().flatMap { $0 == old ? nil : $0 }
            return found != nil
        }
        return (found!, .now)
    }

    /// Polls until every sentinel names `port` as the master (the others learn a failover from
    /// the leader's hello messages, each announcing `+switch-master` as it does).
    public func waitUntilAllSentinelsName(_ port: Int, within limit: Duration = .seconds(15)) async throws {
        try await Poll.within(limit, "every sentinel names \(port)") {
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
}
