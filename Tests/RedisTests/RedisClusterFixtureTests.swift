import Foundation
import NIOConcurrencyHelpers
import TestSupport
import Testing

/// The Redis Cluster fixture itself, checked against what the servers say (`ROLE`, `GET`,
/// redirections), so that the cluster client's tests stand on something known to work.
@Suite("Redis Cluster fixture against redis-server", .serialized, .timeLimit(.minutes(1)))
struct RedisClusterFixtureTests {
    static func withCluster(password: String? = nil, _ body: (RedisClusterProcesses) async throws -> Void) async throws {
        let cluster = try await blocking { try RedisClusterProcesses(password: password) }
        try await withTeardown(cluster, stop: { cluster in _ = try? await blocking { cluster.stop() } }, body)
    }

    @Test("the cluster comes up with 3 masters covering all 16384 slots, each with a replica that follows it")
    func shape() async throws {
        try await Self.withCluster { cluster in
            #expect(cluster.ports.count == 6 && Set(cluster.ports).count == 6)
            let ranges = cluster.slotRanges()
            #expect(ranges.reduce(0) { $0 + $1.slots.count } == 16384)
            #expect(zip(ranges, ranges.dropFirst()).allSatisfy { $0.slots.upperBound + 1 == $1.slots.lowerBound })
            #expect(ranges.first?.slots.lowerBound == 0 && ranges.last?.slots.upperBound == 16383)
            let masters = cluster.masterPorts()
            #expect(masters.count == 3)
            for master in masters {
                let replicas = cluster.replicaPorts(of: master)
                #expect(replicas.count == 1)
                for replica in replicas {
                    guard case .array(let role) = try cluster.send(["ROLE"], port: replica) else { Issue.record("no ROLE"); continue }
                    #expect(role.first?.string == "slave" && role.count > 2 && role[2] == .integer(master), "\(replica): \(role)")
                }
                guard case .array(let role) = try cluster.send(["ROLE"], port: master) else { Issue.record("no ROLE"); continue }
                #expect(role.first?.string == "master")
            }
            #expect(Set(masters + masters.flatMap(cluster.replicaPorts(of:))) == Set(cluster.ports))
        }
    }

    @Test("killing a master promotes its replica within the node timeout plus a measured bound, with the writes it had")
    func failover() async throws {
        try await Self.withCluster { cluster in
            let key = "fixture:{failover}"
            let slot = try #require(cluster.send(["CLUSTER", "KEYSLOT", key], port: cluster.ports[0]).integer)
            let old = try #require(cluster.masterPort(owningSlot: slot))
            let replica = try #require(cluster.replicaPorts(of: old).first)
            #expect(try cluster.send(["SET", key, "kept"], port: old) == .string("OK"))
            try await cluster.waitForReplication(of: old)

            let crashedAt = ContinuousClock.now
            #expect(try cluster.crashMaster(owningSlot: slot) == old)
            let (promoted, seenAt) = try await cluster.waitForPromotion(of: old)
            let elapsed = seenAt - crashedAt
            print("Redis Cluster failover: replica \(promoted) promoted and the cluster ok \(elapsed) after its master was killed (node timeout \(cluster.nodeTimeout))")

            #expect(promoted == replica)
            #expect(cluster.masterPort(owningSlot: slot) == promoted)
            #expect(!cluster.seedPorts.contains(old))
            #expect(try cluster.send(["GET", key], port: promoted) == .string("kept"))
            // Measured on 2 shared cores: 2.2–2.6 s for a 1 s node timeout (the failure agreed by
            // the masters, the replica's election delay of 500 ms + up to 500 ms, the vote, and
            // every node learning the new map); the bound leaves room for a loaded machine.
            #expect(elapsed < cluster.nodeTimeout + .seconds(6))
        }
    }

    @Test("resharding a slot moves a key written in it: the new owner serves it, the old one answers MOVED")
    func reshard() async throws {
        try await Self.withCluster { cluster in
            let key = "fixture:{reshard}"
            let slot = try #require(cluster.send(["CLUSTER", "KEYSLOT", key], port: cluster.ports[0]).integer)
            let source = try #require(cluster.masterPort(owningSlot: slot))
            let target = try #require(cluster.masterPorts().first { $0 != source })
            #expect(try cluster.send(["SET", key, "moved"], port: source) == .string("OK"))
            let sourceSlots = cluster.slotRanges().filter { $0.master == source }.reduce(0) { $0 + $1.slots.count }

            try await cluster.reshard(slots: slot...slot, from: source, to: target)

            #expect(cluster.masterPort(owningSlot: slot) == target)
            #expect(try cluster.send(["GET", key], port: target) == .string("moved"))
            #expect(try cluster.send(["GET", key], port: source) == .error("MOVED \(slot) 127.0.0.1:\(target)"))
            // Only that slot moved.
            #expect(cluster.slotRanges().filter { $0.master == source }.reduce(0) { $0 + $1.slots.count } == sourceSlots - 1)
        }
    }

    @Test("resharding while a client writes through redirections loses no write")
    func reshardUnderWrites() async throws {
        try await Self.withCluster { cluster in
            let tag = "{busy}"
            let counter = "fixture:\(tag):counter"
            let slot = try #require(cluster.send(["CLUSTER", "KEYSLOT", counter], port: cluster.ports[0]).integer)
            let source = try #require(cluster.masterPort(owningSlot: slot))
            let target = try #require(cluster.masterPorts().first { $0 != source })
            // Enough keys in the slot that the move takes many MIGRATE batches.
            let filler = try RedisCommand.Connection(port: source)
            for index in 0..<2000 { _ = try filler.send(["SET", "fixture:\(tag):\(index)", "x"]) }

            let done = NIOLockedValueBox(false)
            async let writer = blocking { () -> (acknowledged: Int, redirections: Int) in
                var port = source
                var acknowledged = 0
                var redirections = 0
                while !done.withLockedValue({ $0 }) {
                    let value = try Self.increment(counter, at: &port, redirections: &redirections)
                    acknowledged += 1
                    guard value == acknowledged else { throw Unexpected(description: "INCR gave \(value), expected \(acknowledged)") }
                }
                return (acknowledged, redirections)
            }
            do {
                try await cluster.reshard(slots: slot...slot, from: source, to: target)
            } catch {
                done.withLockedValue { $0 = true }
                _ = try? await writer
                throw error
            }
            done.withLockedValue { $0 = true }
            let (acknowledged, redirections) = try await writer
            print("Redis Cluster reshard under writes: \(acknowledged) INCRs acknowledged, \(redirections) redirections followed")

            #expect(acknowledged > 0)
            #expect(try cluster.send(["GET", counter], port: target) == .string(String(acknowledged)))
            #expect((try cluster.send(["DBSIZE"], port: target).integer ?? 0) >= 2001)
            #expect(try cluster.send(["CLUSTER", "COUNTKEYSINSLOT", String(slot)], port: source) == .integer(0))
        }
    }

    struct Unexpected: Error, CustomStringConvertible {
        let description: String
    }

    @Test("with a password every node refuses commands without it, and resharding still moves keys")
    func password() async throws {
        try await Self.withCluster(password: "s3cret") { cluster in
            let port = cluster.seedPorts[0]
            guard case .error(let refusal) = try RedisCommand.send(["GET", "x"], port: port) else { Issue.record("answered without AUTH"); return }
            #expect(refusal.hasPrefix("NOAUTH"))
            #expect(cluster.masterPorts().count == 3)
            let key = "fixture:{auth}"
            let slot = try #require(cluster.send(["CLUSTER", "KEYSLOT", key], port: port).integer)
            let source = try #require(cluster.masterPort(owningSlot: slot))
            let target = try #require(cluster.masterPorts().first { $0 != source })
            #expect(try cluster.send(["SET", key, "moved"], port: source) == .string("OK"))
            try await cluster.reshard(slots: slot...slot, from: source, to: target)
            #expect(try cluster.send(["GET", key], port: target) == .string("moved"))
        }
    }

    /// INCR as a cluster client does it: `MOVED` sends it (and the next ones) to the named node;
    /// `ASK` sends this one there once, after `ASKING`.
    static func increment(_ key: String, at port: inout Int, redirections: inout Int) throws -> Int {
        var asking: Int?
        for _ in 0..<5 {
            let node = try RedisCommand.Connection(port: asking ?? port)
            if asking != nil { _ = try node.send(["ASKING"]) }
            switch try node.send(["INCR", key]) {
            case .integer(let value):
                return value
            case .error(let message) where message.hasPrefix("MOVED ") || message.hasPrefix("ASK "):
                redirections += 1
                guard let target = message.split(separator: ":").last.flatMap({ Int($0) }) else { throw Unexpected(description: message) }
                if message.hasPrefix("MOVED ") {
                    port = target
                    asking = nil
                } else {
                    asking = target
                }
            case let reply:
                throw Unexpected(description: "INCR \(key): \(reply)")
            }
        }
        throw Unexpected(description: "INCR \(key): too many redirections")
    }
}
