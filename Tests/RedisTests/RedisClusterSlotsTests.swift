import Foundation
import Logging
import NIOCore
import NIOPosix
import TestSupport
import Testing

@testable import Redis

/// A key, the bytes its slot is the CRC of, and the slot `CLUSTER KEYSLOT` gives (Redis 7.0).
struct KeySlotCase: Sendable, CustomTestStringConvertible {
    let key: [UInt8]
    let hashed: [UInt8]
    let slot: Int

    init(_ key: String, hashes hashed: String? = nil, slot: Int) {
        self.init(Array(key.utf8), hashes: hashed.map { Array($0.utf8) }, slot: slot)
    }

    init(_ key: [UInt8], hashes hashed: [UInt8]? = nil, slot: Int) {
        self.key = key
        self.hashed = hashed ?? key
        self.slot = slot
    }

    var testDescription: String { "\(String(decoding: key, as: UTF8.self).debugDescription) → \(slot)" }

    static let all: [KeySlotCase] = [
        KeySlotCase("foo", slot: 12182),
        KeySlotCase("bar", slot: 5061),
        KeySlotCase("", slot: 0),
        KeySlotCase("{user1000}.following", hashes: "user1000", slot: 3443),
        KeySlotCase("{user1000}.followers", hashes: "user1000", slot: 3443),
        // An empty tag: the whole key, not the next tag.
        KeySlotCase("foo{}{bar}", slot: 8363),
        KeySlotCase("{}", slot: 15257),
        // The tag runs from the first `{` to the first `}` after it.
        KeySlotCase("foo{{bar}}zap", hashes: "{bar", slot: 4015),
        KeySlotCase("foo{bar}{zap}", hashes: "bar", slot: 5061),
        KeySlotCase("{a}{b}", hashes: "a", slot: 15495),
        // No `}` after the `{`, or only before it: the whole key.
        KeySlotCase("foo{", slot: 7673),
        KeySlotCase("}{x}", hashes: "x", slot: 16287),
        // Binary safe: a tag of one byte that is not UTF-8, then a NUL.
        KeySlotCase([0x7B, 0xFF, 0x7D, 0x00], hashes: [0xFF], slot: 7920),
    ]
}

@Suite("Redis Cluster key slots")
struct RedisClusterSlotTests {
    @Test("CRC16-XMODEM of \"123456789\" is the check value 0x31C3")
    func checkValue() {
        #expect(RedisClusterSlot.crc16(Array("123456789".utf8)) == 0x31C3)
    }

    @Test("a key's slot is the CRC16 of its hash tag, or of the whole key, mod 16384", arguments: KeySlotCase.all)
    func slot(_ row: KeySlotCase) {
        #expect(RedisClusterSlot.of(row.key) == row.slot)
        #expect(Int(RedisClusterSlot.crc16(row.hashed)) % RedisClusterSlot.count == row.slot)
    }

    @Test("a String key hashes its UTF-8 bytes")
    func stringKey() {
        #expect(RedisClusterSlot.of("{user1000}.following") == RedisClusterSlot.of(Array("user1000".utf8)))
        #expect(RedisClusterSlot.of("clé") == RedisClusterSlot.of(Array("clé".utf8)))
    }

    @Test("keys sharing a hash tag share a slot")
    func sharedTag() {
        #expect(RedisClusterSlot.of("{user1000}.following") == RedisClusterSlot.of("{user1000}.followers"))
        #expect(RedisClusterSlot.of("sg:{abc}:session") == RedisClusterSlot.of("sg:{abc}:revoked"))
    }

    @Test("redis-server's CLUSTER KEYSLOT agrees with every row of the table", .timeLimit(.minutes(1)))
    func agreesWithRedis() async throws {
        // One node in cluster mode is enough: KEYSLOT needs no slots assigned.
        let configFile = NSTemporaryDirectory() + "sessiongate-keyslot-\(UInt64.random(in: 0 ... .max)).conf"
        let server = try RedisServerProcess(arguments: ["--cluster-enabled", "yes", "--cluster-port", String(try closedPort()),
                                                        "--cluster-config-file", configFile])
        defer {
            server.stop()
            unlink(configFile)
        }
        // Seconds, as the other suites' clients have (the suites share 2 loaded cores): with the
        // shipped 250 ms, a full make test once timed this reply out (2026-11-27), and its
        // sibling below in a clean clone's. And a loop of its own, away from the gateways'.
        let loop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let redis = try RedisClient(configuration: .init(host: "127.0.0.1", port: server.port, commandTimeout: .seconds(3)), group: loop,
                                    logger: Logger(label: "test"))
        for row in KeySlotCase.all {
            let reply = try await redis.send(["CLUSTER", "KEYSLOT", .bytes(row.key)])
            #expect(reply.int == Int64(row.slot), "\(row.testDescription)")
        }
        await redis.close()
        try await loop.shutdownGracefully()
    }
}

/// Builders for synthetic CLUSTER SLOTS replies.
private func node(_ host: String?, _ port: Int64, id: String = "id") -> RESPValue {
    .array([.bulkString(host.map { ByteBuffer(string: $0) }), .integer(port), .bulkString(Array(id.utf8))])
}

private func entry(_ start: Int64, _ end: Int64, _ nodes: RESPValue...) -> RESPValue {
    .array([.integer(start), .integer(end)] + nodes)
}

private func address(_ port: Int, _ host: String = "10.0.0.1") -> RedisAddress { RedisAddress(host: host, port: port) }

/// A reply that is not a usable CLUSTER SLOTS reply, and why.
struct MalformedSlotsCase: Sendable, CustomTestStringConvertible {
    let name: String
    let reply: RESPValue
    var testDescription: String { name }

    static let all: [MalformedSlotsCase] = [
        .init(name: "an error (cluster support disabled)", reply: .error("ERR This instance has cluster support disabled")),
        .init(name: "the null array", reply: .array(nil)),
        .init(name: "an integer", reply: .integer(3)),
        .init(name: "an entry without a node", reply: .array([.array([.integer(0), .integer(16383)])])),
        .init(name: "an entry that is not an array", reply: .array([.integer(0)])),
        .init(name: "a reversed range", reply: .array([entry(10, 5, node("a", 7000))])),
        .init(name: "a range past slot 16383", reply: .array([entry(0, 16384, node("a", 7000))])),
        .init(name: "a negative start", reply: .array([entry(-1, 5, node("a", 7000))])),
        .init(name: "a start that is text", reply: .array([.array([.bulkString(Array("0".utf8)), .integer(5), node("a", 7000)])])),
        .init(name: "port 0", reply: .array([entry(0, 5, node("a", 0))])),
        .init(name: "a port past 65535", reply: .array([entry(0, 5, node("a", 65536))])),
        .init(name: "a port that is text", reply: .array([.array([.integer(0), .integer(5), .array([.bulkString(Array("a".utf8)), .bulkString(Array("7000".utf8))])])])),
        .init(name: "a host that is a number", reply: .array([.array([.integer(0), .integer(5), .array([.integer(1), .integer(7000)])])])),
        .init(name: "a node that is not an array", reply: .array([.array([.integer(0), .integer(5), .bulkString(Array("a:7000".utf8))])])),
        .init(name: "a malformed replica after a good master", reply: .array([entry(0, 5, node("a", 7000), .array([.integer(7001)]))])),
    ]
}

@Suite("Redis Cluster slot map")
struct RedisSlotMapTests {
    let asked = RedisAddress(host: "10.9.9.9", port: 7000)

    @Test("a three-shard reply maps every slot to its master, replicas in (host, port) order")
    func threeShards() throws {
        let reply = RESPValue.array([
            entry(10923, 16383, node("10.0.0.3", 7002), node("10.0.0.6", 7005)),
            entry(0, 5460, node("10.0.0.1", 7000), node("10.0.0.5", 7004), node("10.0.0.4", 7003)),
            entry(5461, 10922, node("10.0.0.2", 7001)),
        ])
        let map = try #require(RedisSlotMap(clusterSlots: reply, asked: asked))
        #expect(map.shards == [
            .init(slots: 0...5460, master: address(7000), replicas: [address(7003, "10.0.0.4"), address(7004, "10.0.0.5")]),
            .init(slots: 5461...10922, master: address(7001, "10.0.0.2"), replicas: []),
            .init(slots: 10923...16383, master: address(7002, "10.0.0.3"), replicas: [address(7005, "10.0.0.6")]),
        ])
        #expect(map.coversAllSlots)
        #expect(map.master(forSlot: 0) == address(7000))
        #expect(map.master(forSlot: 5460) == address(7000))
        #expect(map.master(forSlot: 5461) == address(7001, "10.0.0.2"))
        #expect(map.master(forSlot: 16383) == address(7002, "10.0.0.3"))
        #expect(map.master(forSlot: RedisClusterSlot.of("foo")) == address(7002, "10.0.0.3"))
        #expect(map.masters == [address(7000), address(7001, "10.0.0.2"), address(7002, "10.0.0.3")])
    }

    @Test("a node whose host is empty, \"?\" or null is the asked node's host, on its own port")
    func unknownHost() throws {
        let reply = RESPValue.array([entry(0, 100, node("", 7001), node("?", 7004)), entry(101, 200, node(nil, 7002))])
        let map = try #require(RedisSlotMap(clusterSlots: reply, asked: asked))
        #expect(map.shards.map(\.master) == [RedisAddress(host: "10.9.9.9", port: 7001), RedisAddress(host: "10.9.9.9", port: 7002)])
        #expect(map.shards[0].replicas == [RedisAddress(host: "10.9.9.9", port: 7004)])
    }

    @Test("a gap in the slots has no master and the map does not cover all slots")
    func gap() throws {
        let reply = RESPValue.array([entry(0, 99, node("a", 7000)), entry(101, 16383, node("b", 7001))])
        let map = try #require(RedisSlotMap(clusterSlots: reply, asked: asked))
        #expect(map.master(forSlot: 99) == RedisAddress(host: "a", port: 7000))
        #expect(map.master(forSlot: 100) == nil)
        #expect(map.master(forSlot: 101) == RedisAddress(host: "b", port: 7001))
        #expect(!map.coversAllSlots)
    }

    @Test("slots outside 0..<16384 have no master")
    func outOfRange() throws {
        let map = try #require(RedisSlotMap(clusterSlots: .array([entry(0, 16383, node("a", 7000))]), asked: asked))
        #expect(map.master(forSlot: -1) == nil)
        #expect(map.master(forSlot: 16384) == nil)
    }

    @Test("a node with no slots yet replies with an empty array: a map covering nothing")
    func empty() throws {
        let map = try #require(RedisSlotMap(clusterSlots: .array([]), asked: asked))
        #expect(map.shards.isEmpty && map.masters.isEmpty && !map.coversAllSlots)
        #expect(map.master(forSlot: 0) == nil)
    }

    @Test("a master serving several ranges is listed once among the masters, by its lowest slot")
    func mastersDistinct() throws {
        let reply = RESPValue.array([
            entry(200, 16383, node("a", 7000)), entry(100, 199, node("b", 7001)), entry(0, 99, node("a", 7000)),
        ])
        let map = try #require(RedisSlotMap(clusterSlots: reply, asked: asked))
        #expect(map.masters == [RedisAddress(host: "a", port: 7000), RedisAddress(host: "b", port: 7001)])
        #expect(map.coversAllSlots)
    }

    @Test("two nodes' replies listing the same cluster in different orders give equal maps")
    func orderInsensitive() throws {
        let one = RESPValue.array([entry(0, 8191, node("a", 7000), node("c", 7002), node("d", 7003)), entry(8192, 16383, node("b", 7001))])
        let other = RESPValue.array([entry(8192, 16383, node("b", 7001)), entry(0, 8191, node("a", 7000), node("d", 7003), node("c", 7002))])
        #expect(RedisSlotMap(clusterSlots: one, asked: asked) == RedisSlotMap(clusterSlots: other, asked: asked))
        let moved = RESPValue.array([entry(0, 8190, node("a", 7000)), entry(8191, 16383, node("b", 7001))])
        #expect(RedisSlotMap(clusterSlots: one, asked: asked) != RedisSlotMap(clusterSlots: moved, asked: asked))
    }

    @Test("fields after a node's port (id, Redis 7 metadata) are ignored")
    func extraFields() throws {
        let master = RESPValue.array([.bulkString(Array("a".utf8)), .integer(7000), .bulkString(Array("abc".utf8)), .array([]),
                                      .array([.bulkString(Array("hostname".utf8)), .bulkString(Array("host-a".utf8))])])
        let map = try #require(RedisSlotMap(clusterSlots: .array([.array([.integer(0), .integer(16383), master])]), asked: asked))
        #expect(map.shards == [.init(slots: 0...16383, master: RedisAddress(host: "a", port: 7000), replicas: [])])
    }

    @Test("a reply that is not a CLUSTER SLOTS reply gives no map", arguments: MalformedSlotsCase.all)
    func malformed(_ row: MalformedSlotsCase) {
        #expect(RedisSlotMap(clusterSlots: row.reply, asked: asked) == nil)
    }

    @Test("changing the shards rebuilds the lookup")
    func mutation() {
        var map = RedisSlotMap(shards: [.init(slots: 0...16383, master: address(7000))])
        map.shards[0].slots = 0...99
        map.shards.append(.init(slots: 100...16383, master: address(7001)))
        #expect(map.master(forSlot: 99) == address(7000))
        #expect(map.master(forSlot: 100) == address(7001))
        #expect(map.coversAllSlots)
    }

    @Test("a real cluster's reply parses to the map every node reports", .timeLimit(.minutes(1)))
    func realCluster() async throws {
        let cluster = try await blocking { try RedisClusterProcesses() }
        try await withTeardown(cluster, stop: { cluster in _ = try? await blocking { cluster.stop() } }) { cluster in
            let seed = cluster.seedPorts[0]
            let redis = try RedisClient(configuration: .init(host: "127.0.0.1", port: seed, commandTimeout: .seconds(3)),
                                        group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
            let reply = try await redis.send(["CLUSTER", "SLOTS"])
            await redis.close()
            let map = try #require(RedisSlotMap(clusterSlots: reply, asked: RedisAddress(host: "127.0.0.1", port: seed)))
            #expect(map.coversAllSlots)
            #expect(map.masters.map(\.port) == cluster.masterPorts())
            #expect(map.masters.allSatisfy { $0.host == "127.0.0.1" })
            let ports = map.shards.map { RedisClusterProcesses.SlotRange(slots: $0.slots, master: $0.master.port, replicas: $0.replicas.map(\.port)) }
            #expect(ports == cluster.slotRanges())
            for slot in [0, 5460, 5461, 10922, 10923, 16383, RedisClusterSlot.of("foo")] {
                #expect(map.master(forSlot: slot)?.port == cluster.masterPort(owningSlot: slot))
            }
        }
    }
}
