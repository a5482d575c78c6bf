import NIOCore
import Redis
import Testing

/// What the cluster client does with an answer that is not a reply: a pure decision.
@Suite("Redis Cluster redirects")
struct RedisClusterRedirectTests {
    typealias Decision = RedisClusterRedirect.Decision
    static let node = RedisAddress(host: "10.0.0.7", port: 6380)
    static let time = TimeAmount.milliseconds(200)

    @Test("each answer is followed, paused on or given up, within the time left", arguments: [
        ("MOVED goes where it says and reads the map again", RedisError.server("MOVED 3999 10.0.0.7:6380"), true, time,
         Decision.retry(.init(address: node, asking: false), refresh: true, after: .zero)),
        ("ASK goes there once, asking", .server("ASK 3999 10.0.0.7:6380"), true, time, .retry(.init(address: node, asking: true), refresh: false, after: .zero)),
        ("ASK for a transaction waits for the slot to finish moving", .server("ASK 3999 10.0.0.7:6380"), false, time,
         .retry(nil, refresh: false, after: RedisClusterRedirect.pause)),
        ("TRYAGAIN pauses", .server("TRYAGAIN Multiple keys request during rehashing of slot"), true, time, .retry(nil, refresh: false, after: RedisClusterRedirect.pause)),
        ("CLUSTERDOWN pauses and reads the map again", .server("CLUSTERDOWN The cluster is down"), true, time, .retry(nil, refresh: true, after: RedisClusterRedirect.pause)),
        ("a node that cannot be reached: the map may name its replacement", .unavailable, true, time, .retry(nil, refresh: true, after: RedisClusterRedirect.pause)),
        ("a pause never outlasts the time left", .unavailable, true, .milliseconds(5), .retry(nil, refresh: true, after: .milliseconds(5))),
        ("no time left: fail", .server("MOVED 3999 10.0.0.7:6380"), true, .zero, .fail),
        ("a timeout used the time up", .timeout, true, time, .fail),
        ("an error of the command itself", .server("WRONGTYPE Operation against a key holding the wrong kind of value"), true, time, .fail),
        ("a MOVED without an address", .server("MOVED 3999"), true, time, .fail),
        ("a MOVED to a port out of range", .server("MOVED 3999 10.0.0.7:70000"), true, time, .fail),
        ("a TLS failure does not mend by retrying", .tls("bad certificate"), true, time, .fail),
    ] as [(String, RedisError, Bool, TimeAmount, Decision)])
    func decide(_ name: String, error: RedisError, askable: Bool, remaining: TimeAmount, expected: Decision) {
        #expect(RedisClusterRedirect.decide(error, askable: askable, remaining: remaining) == expected, "\(name)")
    }

    @Test("IPv6 nodes are named with brackets or without")
    func ipv6() {
        let v6 = RedisAddress(host: "::1", port: 7000)
        #expect(RedisClusterRedirect.decide(.server("MOVED 1 [::1]:7000"), askable: true, remaining: Self.time) == .retry(.init(address: v6, asking: false), refresh: true, after: .zero))
        #expect(RedisClusterRedirect.decide(.server("MOVED 1 ::1:7000"), askable: true, remaining: Self.time) == .retry(.init(address: v6, asking: false), refresh: true, after: .zero))
    }

    @Test("a command is routed by its key, a script by its first declared key, and keyless commands anywhere", arguments: [
        (["HGETALL", "sg:user:{u1}"] as [RedisArgument], RedisClusterSlot.of("u1") as Int?),
        (["EVAL", "return 1", "2", "sg:session:{u1}:ab", "sg:user:{u1}"], RedisClusterSlot.of("u1")),
        (["eval", "return 1", "0"], nil),
        (["PING"], nil),
        (["PUBLISH", "sg:invalidate", "user u1"], nil),
        (["MULTI"], nil),
        (["SCAN", "0"], nil),
        (["GET", "plain"], RedisClusterSlot.of("plain")),
    ])
    func routing(_ command: [RedisArgument], slot: Int?) {
        #expect(RedisClusterRedirect.slot(of: command) == slot)
    }
}
