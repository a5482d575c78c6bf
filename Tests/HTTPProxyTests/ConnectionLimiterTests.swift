import Testing

@testable import HTTPProxy

@Suite("Connection caps (no I/O)")
struct ConnectionLimiterTests {
    @Test("a connection over the instance cap or its client's cap is refused, and says which", arguments: [
        ("no caps", 5000, 5000 as Int?, 0, 0, ConnectionRefusal?.none),
        ("under both", 9, 3, 10, 4, nil),
        ("instance full", 10, 0, 10, 4, .instance),
        ("client full", 9, 4, 10, 4, .client),
        ("both full: the instance is named", 10, 4, 10, 4, .instance),
        ("a trusted proxy is not counted per client", 9, nil, 10, 4, nil),
        ("only a client cap", 100_000, 1, 0, 1, .client),
    ] as [(String, Int, Int?, Int, Int, ConnectionRefusal?)])
    func refusal(name: String, total: Int, ofClient: Int?, maxTotal: Int, maxPerClient: Int, expected: ConnectionRefusal?) {
        #expect(ConnectionLimiter.refusal(total: total, ofClient: ofClient, maxTotal: maxTotal, maxPerClient: maxPerClient) == expected, "\(name)")
    }

    @Test("places are counted on open and given back on close, per client")
    func counting() {
        let limiter = ConnectionLimiter(maxTotal: 3, maxPerClient: 2)
        #expect(limiter.open(client: "192.0.2.1") == nil)
        #expect(limiter.open(client: "192.0.2.1") == nil)
        #expect(limiter.open(client: "192.0.2.1") == .client)
        #expect(limiter.open(client: "192.0.2.2") == nil)
        #expect(limiter.open(client: nil) == .instance)
        limiter.close(client: "192.0.2.1")
        #expect(limiter.open(client: "192.0.2.1") == nil, "the closed connection's place came back")
    }
}
