/// The `X-Request-Id` of requests that come without one: xorshift64*, seeded per connection —
/// unique enough to correlate log lines, and cheap.
struct RequestIDs {
    private var state: UInt64

    init(seed: UInt64) { state = seed | 1 }

    /// 16 lower-case hex digits, written in place (`String(_:radix:)` and padding cost ~3 % of a
    /// proxied request).
    mutating func next() -> String {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        var value = state &* 2_685_821_657_736_338_717
        return String(unsafeUninitializedCapacity: 16) { out in
            for i in stride(from: 15, through: 0, by: -1) {
                let digit = UInt8(truncatingIfNeeded: value & 0xF)
                out[i] = digit < 10 ? 0x30 + digit : 0x57 + digit
                value >>= 4
            }
            return 16
        }
    }
}
