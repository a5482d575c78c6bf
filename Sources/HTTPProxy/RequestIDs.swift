/// The `X-Request-Id` of requests that come without one, and the ids of the spans and traces
/// the gateway starts: xorshift64*, seeded per connection — unique enough to correlate log
/// lines and spans, and cheap.
struct RequestIDs {
    private var state: UInt64

    init(seed: UInt64) { state = seed | 1 }

    /// 16 lower-case hex digits, written in place (`String(_:radix:)` and padding cost ~3 % of a
    /// proxied request).
    mutating func next() -> String { Hex.string(nextValue()) }

    /// The next 64 bits, never 0 (a span id).
    mutating func nextValue() -> UInt64 {
        state ^= state >> 12
        state ^= state << 25
        state ^= state >> 27
        return state &* 2_685_821_657_736_338_717
    }
}
