/// Redis Cluster's key → slot function (CRC16-XMODEM of the key, or of its hash tag: the bytes
/// between the first `{` and the next `}` when that is non-empty), mod 16384.
///
/// The hash tag rule is the server's (`keyHashSlot` in cluster.c): only the first `{` counts,
/// and an empty tag (`{}`) means the whole key is hashed, so `foo{}{bar}` hashes all of it and
/// `foo{{bar}}zap` hashes `{bar`.
public enum RedisClusterSlot {
    /// How many slots a cluster has: 0 ..< 16384.
    public static let count = 16384

    /// The slot of a key given as bytes (binary safe).
    public static func of<Bytes: Collection>(_ key: Bytes) -> Int where Bytes.Element == UInt8 {
        if let open = key.firstIndex(of: UInt8(ascii: "{")) {
            let tagStart = key.index(after: open)
            if let close = key[tagStart...].firstIndex(of: UInt8(ascii: "}")), close != tagStart {
                return Int(crc16(key[tagStart..<close]) & 0x3FFF)
            }
        }
        return Int(crc16(key) & 0x3FFF)
    }

    /// The slot of a key given as text: of its UTF-8 bytes.
    public static func of(_ key: String) -> Int { of(key.utf8) }

    /// CRC16-XMODEM (CCITT polynomial 0x1021, initial value 0, no reflection, no final XOR): the
    /// variant named in the Redis Cluster specification, whose check value for "123456789" is
    /// 0x31C3.
    static func crc16<Bytes: Collection>(_ bytes: Bytes) -> UInt16 where Bytes.Element == UInt8 {
        var crc: UInt16 = 0
        for byte in bytes {
            crc = (crc << 8) ^ crc16Table[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ byte)]
        }
        return crc
    }

    /// The CRC of every byte value, for the byte-at-a-time loop.
    private static let crc16Table: [UInt16] = (0..<256).map { value in
        var crc = UInt16(value) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }
}

/// A cluster's slot map, from `CLUSTER SLOTS` (RESP2 reply: an array of
/// [start, end, [host, port, id, …], replica…]).
public struct RedisSlotMap: Sendable, Equatable {
    /// A range of slots and the nodes serving it.
    public struct Shard: Sendable, Equatable {
        public var slots: ClosedRange<Int>
        public var master: RedisAddress
        public var replicas: [RedisAddress]

        public init(slots: ClosedRange<Int>, master: RedisAddress, replicas: [RedisAddress] = []) {
            self.slots = slots
            self.master = master
            self.replicas = replicas
        }
    }

    /// The shards, ordered by their first slot. A master serving several ranges appears once
    /// per range. Changing them rebuilds the lookup table.
    public var shards: [Shard] {
        didSet { table = Self.table(shards) }
    }

    /// For each slot, the index in `shards` of the shard serving it, or -1.
    private var table: [Int32]

    /// nil when the reply is not a CLUSTER SLOTS reply. `asked` is the node the reply came
    /// from: a node entry whose host is empty ("" = unknown endpoint) or "?" means that node's
    /// host.
    ///
    /// Strict: a range outside 0 ..< 16384 or reversed, a port outside 1 ... 65535, or an entry
    /// of the wrong shape makes the whole reply nil (a half-read map would send keys to the
    /// wrong node). Fields after a node's port (its id, and its metadata since Redis 7) are
    /// ignored. Replicas are kept in (host, port) order, and the shards in slot order, so that
    /// two nodes' replies describing the same cluster compare equal.
    public init?(clusterSlots reply: RESPValue, asked: RedisAddress) {
        guard case .array(let entries?) = reply else { return nil }
        var shards: [Shard] = []
        shards.reserveCapacity(entries.count)
        for entry in entries {
            guard case .array(let fields?) = entry, fields.count >= 3,
                  let start = fields[0].int, let end = fields[1].int,
                  0 <= start, start <= end, end < RedisClusterSlot.count else { return nil }
            var nodes: [RedisAddress] = []
            for field in fields[2...] {
                guard let node = Self.node(field, asked: asked) else { return nil }
                nodes.append(node)
            }
            let replicas = nodes.dropFirst().sorted { ($0.host, $0.port) < ($1.host, $1.port) }
            shards.append(Shard(slots: Int(start)...Int(end), master: nodes[0], replicas: replicas))
        }
        self.init(shards: shards.sorted { $0.slots.lowerBound < $1.slots.lowerBound })
    }

    /// A map of these shards, as given. A slot two shards claim is served by the later one;
    /// slots outside 0 ..< 16384 are ignored.
    public init(shards: [Shard]) {
        self.shards = shards
        self.table = Self.table(shards)
    }

    /// The master serving `slot` (nil: a slot no shard covers, e.g. during a cluster change).
    /// O(1): a 16384-entry table built once in init.
    public func master(forSlot slot: Int) -> RedisAddress? {
        guard table.indices.contains(slot) else { return nil }
        let index = Int(table[slot])
        return index < 0 ? nil : shards[index].master
    }

    /// Every distinct master, in a stable order: by the lowest slot it serves (whatever order
    /// the shards were given in).
    public var masters: [RedisAddress] {
        var seen: [RedisAddress] = []
        for shard in shards.sorted(by: { $0.slots.lowerBound < $1.slots.lowerBound }) where !seen.contains(shard.master) {
            seen.append(shard.master)
        }
        return seen
    }

    /// True when every slot 0..<16384 is covered.
    public var coversAllSlots: Bool { !table.contains(-1) }

    /// Equal when the shards are: the table is derived from them.
    public static func == (lhs: RedisSlotMap, rhs: RedisSlotMap) -> Bool { lhs.shards == rhs.shards }

    /// One node of an entry: [host, port, …]; "" or "?" (or a null host) is `asked`'s host.
    private static func node(_ value: RESPValue, asked: RedisAddress) -> RedisAddress? {
        guard case .array(let fields?) = value, fields.count >= 2, let port = fields[1].int, (1...65535).contains(port) else { return nil }
        let host: String
        switch fields[0] {
        case .bulkString(nil): host = asked.host
        case let value:
            guard let text = value.string else { return nil }
            host = text.isEmpty || text == "?" ? asked.host : text
        }
        return RedisAddress(host: host, port: Int(port))
    }

    private static func table(_ shards: [Shard]) -> [Int32] {
        let all = 0...(RedisClusterSlot.count - 1)
        var table = [Int32](repeating: -1, count: RedisClusterSlot.count)
        for (index, shard) in shards.enumerated() where shard.slots.overlaps(all) {
            for slot in shard.slots.clamped(to: all) { table[slot] = Int32(index) }
        }
        return table
    }
}
