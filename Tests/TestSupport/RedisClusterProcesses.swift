import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A Redis Cluster on loopback for one test: `masters` masters with `replicasPerMaster` replicas
/// each, every node a `RedisServerProcess` on a free port with its cluster bus on another free
/// port (`--cluster-port`: the default, port + 10000, may be taken or past 65535). Created by
/// `redis-cli --cluster create`, and ready when constructed: every node reports
/// `cluster_state:ok`, every replica is in sync, and every node gives the same `CLUSTER SLOTS`.
///
/// Replicas always stand for election (`cluster-replica-validity-factor 0`), so a failover does
/// not depend on how recently a replica heard from its master. `stop()` ends every node and
/// removes their files (node configurations, snapshots); the exit handler of
/// `RedisServerProcess` kills any a failed test left behind. Its start-up blocks for seconds:
/// make it with `blocking { try RedisClusterProcesses() }`.
public final class RedisClusterProcesses: @unchecked Sendable {
    /// Every node, in start order (which become masters is redis-cli's choice: ask
    /// `masterPorts()`).
    public let servers: [RedisServerProcess]
    public let password: String?
    /// `cluster-node-timeout`: how long a node may be unreachable before it is failed over.
    public let nodeTimeout: Duration
    private let directory: String
    /// With `tls`: each node's TLS port, by its plain port. A TLS client is told TLS ports by
    /// `CLUSTER SLOTS` (`tls-cluster yes`); the fixture itself keeps to the plain ones.
    public let tlsPorts: [Int: Int]
    private let lock = NSLock()
    private var crashed: Set<Int> = []
    /// The replicas a crashed master had, the candidates for its promotion.
    private var replicasOfCrashed: [Int: [Int]] = [:]

    /// A range of slots as the cluster reports it (`CLUSTER SLOTS`), by port.
    public struct SlotRange: Equatable, Sendable, CustomStringConvertible {
        public let slots: ClosedRange<Int>
        public let master: Int
        /// In port order.
        public let replicas: [Int]

        public init(slots: ClosedRange<Int>, master: Int, replicas: [Int]) {
            self.slots = slots
            self.master = master
            self.replicas = replicas.sorted()
        }

        public var description: String { "\(slots.lowerBound)-\(slots.upperBound)@\(master)\(replicas.map { "+\($0)" }.joined())" }
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// - Parameters:
    ///   - masters: at least 3 (`redis-cli --cluster create` refuses fewer).
    ///   - nodeTimeout: `cluster-node-timeout`; short, so that failover tests are quick.
    ///   - password: `requirepass` and `masterauth` on every node; the fixture authenticates
    ///     its own commands (pass it here, not as `--requirepass` in `arguments`).
    ///   - arguments: more redis-server flags for every node.
    ///   - limit: for the whole start-up.
    ///   - tls: also serve TLS on a port of its own (cluster bus and replication over TLS too);
    ///     the node's certificate is its client certificate on the bus.
    public init(masters: Int = 3, replicasPerMaster: Int = 1, nodeTimeout: Duration = .milliseconds(1000), password: String? = nil,
                tls: RedisServerProcess.TLS? = nil, arguments: [String] = [], within limit: TimeInterval = 30) throws {
        precondition(masters >= 3, "redis-cli --cluster create needs at least 3 masters")
        self.password = password
        self.nodeTimeout = nodeTimeout
        directory = NSTemporaryDirectory() + "sessiongate-cluster-\(UInt64.random(in: 0 ... .max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let deadline = Date().addingTimeInterval(limit)
        let milliseconds = nodeTimeout.components.seconds * 1000 + nodeTimeout.components.attoseconds / 1_000_000_000_000_000
        // Later flags win: `--dir` moves the node's files (relative paths) into `directory`. A
        // replica's first sync waits 5 s by default (`repl-diskless-sync-delay`, for more
        // replicas to share it). CLUSTER SLOTS lists a replica only once its replication offset
        // is not 0, and with no writes that takes the master's first ping into the stream
        // (`repl-ping-replica-period`, 10 s by default): 1 s instead.
        var common = ["--cluster-enabled", "yes", "--cluster-node-timeout", String(milliseconds),
                      "--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1",
                      "--dir", directory]
        if let password { common += ["--requirepass", password, "--masterauth", password] }
        if let tls {
            common += ["--tls-cert-file", tls.certificateFile, "--tls-key-file", tls.privateKeyFile, "--tls-ca-cert-file", tls.caFile,
                       "--tls-auth-clients", tls.authClients ? "yes" : "no", "--tls-cluster", "yes", "--tls-replication", "yes"]
        }
        var started: [RedisServerProcess] = []
        var tlsPorts: [Int: Int] = [:]
        do {
            for _ in 0..<masters * (1 + replicasPerMaster) {
                let (node, tlsPort) = try Self.startNode(common + arguments, tls: tls != nil)
                started.append(node)
                tlsPorts[node.port] = tlsPort
            }
            servers = started
            self.tlsPorts = tlsPorts
            var create = ["--cluster", "create"] + started.map { "127.0.0.1:\($0.port)" }
            create += ["--cluster-replicas", String(replicasPerMaster), "--cluster-yes"]
            if let password { create += ["-a", password, "--no-auth-warning"] }
            let (status, output) = runCapturingOutput("/usr/bin/redis-cli", create)
            guard status == 0 else { throw Failure(description: "redis-cli --cluster create failed (\(status)): \(output.suffix(2000))") }
            try Poll.until(deadline, "the cluster is ok, in sync and agreed on every node") {
                self.isSettled(masters: masters, replicasPerMaster: replicasPerMaster)
            }
        } catch {
            started.forEach { $0.stop() }
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// One cluster node on a free port, its bus on another; new ports when a parallel test took
    /// one of them first.
    private static func startNode(_ arguments: [String], tls: Bool) throws -> (RedisServerProcess, tlsPort: Int?) {
        func start() throws -> (RedisServerProcess, tlsPort: Int?) {
            let port = try closedPort()
            var bus = try closedPort()
            while bus == port { bus = try closedPort() }
            var node = ["--cluster-port", String(bus), "--cluster-config-file", "nodes-\(port).conf", "--dbfilename", "dump-\(port).rdb"]
            var tlsPort: Int? = nil
            if tls {
                var p = try closedPort()
                while p == port || p == bus { p = try closedPort() }
                tlsPort = p
                node += ["--tls-port", String(p)]
            }
            return (try RedisServerProcess(port: port, arguments: arguments + node), tlsPort)
        }
        for _ in 1..<5 {
            do {
                return try start()
            } catch RedisServerProcess.Failure.didNotStart(let output) where output.contains("already in use") {
                continue
            }
        }
        return try start()
    }

    // MARK: - Reading the cluster

    /// Every node's port, in start order.
    public var ports: [Int] { servers.map(\.port) }

    /// The ports of the nodes still running (not crashed): where a client may start.
    public var seedPorts: [Int] {
        let crashed = lock.withLock { self.crashed }
        return ports.filter { !crashed.contains($0) }
    }

    /// The node listening on `port`.
    public func server(on port: Int) -> RedisServerProcess? { servers.first { $0.port == port } }

    /// Sends one command to the node on `port` (authenticated with `password`).
    public func send(_ arguments: [String], port: Int) throws -> RedisCommand.Reply {
        try RedisCommand.send(arguments, port: port, password: password)
    }

    /// The slot map as the node on `port` reports it (`CLUSTER SLOTS`), in slot order; nil when
    /// it does not answer or the reply is not one.
    public func slotRanges(reportedBy port: Int) -> [SlotRange]? {
        guard case .array(let entries)? = try? send(["CLUSTER", "SLOTS"], port: port) else { return nil }
        var ranges: [SlotRange] = []
        for entry in entries {
            guard case .array(let fields) = entry, fields.count >= 3, let start = fields[0].integer, let end = fields[1].integer else { return nil }
            var nodes: [Int] = []
            for field in fields[2...] {
                guard case .array(let node) = field, node.count >= 2, let port = node[1].integer else { return nil }
                nodes.append(port)
            }
            ranges.append(SlotRange(slots: start...end, master: nodes[0], replicas: Array(nodes.dropFirst())))
        }
        return ranges.sorted { $0.slots.lowerBound < $1.slots.lowerBound }
    }

    /// The slot map as the first running node that answers reports it.
    public func slotRanges() -> [SlotRange] {
        for port in seedPorts {
            if let ranges = slotRanges(reportedBy: port) { return ranges }
        }
        return []
    }

    /// Every master serving slots, ordered by the lowest slot it serves.
    public func masterPorts() -> [Int] {
        var masters: [Int] = []
        for range in slotRanges() where !masters.contains(range.master) { masters.append(range.master) }
        return masters
    }

    /// The master serving `slot`, as a running node reports it.
    public func masterPort(owningSlot slot: Int) -> Int? {
        slotRanges().first { $0.slots.contains(slot) }?.master
    }

    /// The replicas of the master on `port` (from the slot map: those in sync enough to be listed).
    public func replicaPorts(of master: Int) -> [Int] {
        slotRanges().first { $0.master == master }?.replicas ?? []
    }

    /// The node's cluster id (`CLUSTER MYID`).
    public func nodeID(port: Int) throws -> String {
        guard let id = try send(["CLUSTER", "MYID"], port: port).string else { throw Failure(description: "no CLUSTER MYID from \(port)") }
        return id
    }

    /// True when every running node reports `cluster_state:ok` and the same slot map.
    public func isAgreed() -> Bool {
        var maps: [[SlotRange]] = []
        for port in seedPorts {
            guard (try? send(["CLUSTER", "INFO"], port: port))?.string?.contains("cluster_state:ok") == true,
                  let ranges = slotRanges(reportedBy: port) else { return false }
            maps.append(ranges)
        }
        return maps.allSatisfy { $0 == maps.first }
    }

    /// Agreed, with the expected shape: every slot served, `masters` masters each listing
    /// `replicasPerMaster` replicas, every replica's link to its master up.
    private func isSettled(masters: Int, replicasPerMaster: Int) -> Bool {
        guard isAgreed() else { return false }
        let ranges = slotRanges()
        var covered = 0
        var replicasByMaster: [Int: [Int]] = [:]
        for range in ranges {
            covered += range.slots.count
            replicasByMaster[range.master] = range.replicas
        }
        guard covered == 16384, replicasByMaster.count == masters,
              replicasByMaster.values.allSatisfy({ $0.count == replicasPerMaster }) else { return false }
        return replicasByMaster.values.joined().allSatisfy { RedisCommand.info(port: $0, password: password)["master_link_status"] == "up" }
    }

    // MARK: - Failures

    /// Kills (SIGKILL: nothing flushed or handed over) the master serving `slot`; its port.
    @discardableResult
    public func crashMaster(owningSlot slot: Int) throws -> Int {
        guard let port = masterPort(owningSlot: slot), let master = server(on: port) else {
            throw Failure(description: "no master serves slot \(slot)")
        }
        let replicas = replicaPorts(of: port)
        master.crash()
        lock.withLock {
            crashed.insert(port)
            replicasOfCrashed[port] = replicas
        }
        return port
    }

    /// Polls (every 50 ms) until one of the replicas the crashed master on `oldPort` had reports
    /// the role master and every running node agrees on a slot map, `cluster_state:ok`: the new
    /// master's port, and when that was first seen.
    public func waitForPromotion(of oldPort: Int, within limit: Duration = .seconds(20)) async throws -> (newMasterPort: Int, seenAt: ContinuousClock.Instant) {
        guard let candidates = lock.withLock({ replicasOfCrashed[oldPort] }), !candidates.isEmpty else {
            throw Failure(description: "\(oldPort) is not a crashed master with replicas")
        }
        var promoted: Int?
        try await Poll.within(limit, "a replica of \(oldPort) (\(candidates)) is promoted and the cluster is ok") {
            promoted = candidates.first { port in
                guard case .array(let role)? = try? self.send(["ROLE"], port: port) else { return false }
                return role.first?.string == "master"
            }
            return promoted != nil && self.isAgreed() && self.masterPorts().contains(promoted!)
        }
        return (promoted!, .now)
    }

    /// Waits until every replica of the master on `port` has every write the master has
    /// (replication is asynchronous: a write not yet replicated is lost in a failover).
    public func waitForReplication(of port: Int, within limit: Duration = .seconds(10)) async throws {
        guard let offset = RedisCommand.info(port: port, password: password)["master_repl_offset"].flatMap({ Int($0) }) else {
            throw Failure(description: "no replication offset from \(port)")
        }
        for replica in replicaPorts(of: port) {
            try await Poll.within(limit, "the replica \(replica) reaches offset \(offset)") {
                (RedisCommand.info(port: replica, password: self.password)["slave_repl_offset"].flatMap { Int($0) } ?? -1) >= offset
            }
        }
    }

    public func stop() {
        servers.forEach { $0.stop() }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
