/// The `X-Request-Id` of requests that come without one, and the ids of the spans and traces
/// the gateway starts: a counter seeded per connection, through SipHash under the process's
/// random key (Swift's `Hasher`) — cheap, and unpredictable from the ids seen before, which an
/// `echo` route relies on (a response can echo only the id of the request it answers).
struct RequestIDs {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    /// 16 lower-case hex digits, written in place (`String(_:radix:)` and padding cost ~3 % of a
    /// proxied request).
    mutating func next() -> String { Hex.string(nextValue()) }

    /// The next 64 bits, never 0 (a span id).
    mutating func nextValue() -> UInt64 {
        state &+= 1
        var hasher = Hasher()
        hasher.combine(state)
        let value = UInt64(bitPattern: Int64(hasher.finalize()))
        return value == 0 ? 1 : value
    }
}
