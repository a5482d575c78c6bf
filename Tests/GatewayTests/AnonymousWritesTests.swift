import Foundation
import GatewayConfig
import Logging
import Redis
import TestSupport
import Testing

@testable import Gateway

/// Issue 23 §2: the anonymous endpoints that write to the store (`GET /_auth/login`, `POST
/// /_auth/native/nonce`) are bounded per client address and per instance, so that a flood
/// cannot fill Redis and fail every session.
@Suite("Anonymous store writes end to end", .serialized, .timeLimit(.minutes(2)))
struct AnonymousWritesTests {
    /// What a flooder saw: responses by status, the `Retry-After` values of the refusals, one
    /// refused body of each endpoint.
    struct Flood: Sendable {
        var statuses: [String: [Int: Int]] = [:]
        var retryAfters: Set<Int> = []
        var refusedBodies: [String: String] = [:]
        var unexpected: [String] = []
    }

    /// Sends `count` requests of each endpoint from `source` (a loopback address of its own),
    /// pipelined in batches on one connection, each request naming `forwardedFor` (a rotating
    /// list: one per request) when given.
    static func flood(port: Int, source: String, count: Int, forwardedFor: [String] = []) async throws -> Flood {
        try await blocking {
            var flood = Flood()
            var client = try RawClient(port: port, timeoutSeconds: 20, source: source)
            let batch = 50
            var sent = 0
            while sent < count {
                let n = min(batch, count - sent)
                var requests = ""
                for i in sent..<(sent + n) {
                    let forwarded = forwardedFor.isEmpty ? "" : "X-Forwarded-For: \(forwardedFor[i % forwardedFor.count])\r\n"
                    requests += "GET /_auth/login?rd=%2Fx HTTP/1.1\r\nHost: localhost:\(port)\r\nAccept: text/html\r\n\(forwarded)\r\n"
                    requests += "POST /_auth/native/nonce HTTP/1.1\r\nHost: localhost:\(port)\r\nContent-Length: 0\r\n\(forwarded)\r\n"
                }
                do {
                    try client.send(requests)
                    for _ in 0..<n {
                        for endpoint in ["login", "native_nonce"] {
                            let r = try client.readResponse()
                            flood.statuses[endpoint, default: [:]][r.status, default: 0] += 1
                            switch r.status {
                            case 302 where endpoint == "login", 200 where endpoint == "native_nonce":
                                break
                            case 429, 503:
                                if let wait = r.header("retry-after").flatMap(Int.init) { flood.retryAfters.insert(wait) } else { flood.unexpected.append("\(endpoint) \(r.status) without Retry-After") }
                                flood.refusedBodies[endpoint] = flood.refusedBodies[endpoint] ?? r.text
                            default:
                                flood.unexpected.append("\(endpoint) \(r.status) \(r.text.prefix(200))")
                            }
                        }
                    }
                } catch RawClient.Failure.closed {
                    client = try RawClient(port: port, timeoutSeconds: 20, source: source)  // the gateway may end a connection; go on with another
                }
                sent += n
            }
            return flood
        }
    }

    /// The login states and nonces in the harness's Redis.
    static func storedKeys(_ h: SignInHarness) async throws -> (logins: Int, nonces: Int) {
        let redis = try #require(h.redis)
        return try await withTeardown(RedisClient(configuration: .init(host: redis.host, port: redis.port, database: redis.database, commandTimeout: .seconds(3)),
                                     group: .singleton, logger: Logger(label: "t")), stop: { await $0.close() }) { client in
            let prefix = h.configuration.store.keyPrefix
            func count(_ pattern: String) async throws -> Int {
                guard case .array(let items?) = try await client.send(["KEYS", .string(prefix + pattern)]) else { return -1 }
                return items.count
            }
            return (try await count("login:*"), try await count("nonce:*"))
        }
    }

    @Test("one address floods login and nonce: a bounded number of keys, 429 with Retry-After, and a user elsewhere signs in")
    func floodFromOneAddress() async throws {
        try await SignInHarness.with(store: .redis) { h in  // the shipped defaults: 60 a minute per client, 10000 per instance
            // One window for the whole test, however slowly a loaded machine runs the flood (it took
            // over a minute once beside a release build, and the window rolled over).
            h.clock.freeze()
            let limit = GatewayConfiguration.Apple().loginsPerMinute
            // Ten times the limit of each endpoint: enough to show the bound, light enough not to
            // starve the suites that share the process's event loops (5,000 did, once: Apple
            // exchanges of other suites timed out behind it).
            let requests = 600
            let flood = try await Self.flood(port: h.gatewayPort, source: "127.0.0.2", count: requests)
            #expect(flood.unexpected.isEmpty, "\(flood.unexpected.prefix(5))")
            // One window per endpoint, `limit` writes in each.
            #expect(flood.statuses["login"] == [302: limit, 429: requests - limit], "\(flood.statuses)")
            #expect(flood.statuses["native_nonce"] == [200: limit, 429: requests - limit], "\(flood.statuses)")
            #expect(!flood.retryAfters.isEmpty && flood.retryAfters.allSatisfy { (1...60).contains($0) }, "\(flood.retryAfters)")
            #expect(flood.refusedBodies["login"]?.contains("Too many sign-ins just now") == true, "a page for the browser")
            #expect(flood.refusedBodies["native_nonce"]?.contains("\"too_many_requests\"") == true)
            let keys = try await Self.storedKeys(h)
            #expect(keys.logins == limit && keys.nonces == limit, "the store holds what was admitted, no more: \(keys)")

            // Meanwhile a person at another address (127.0.0.1) signs in, web and native.
            let b = TestBrowser(gatewayOrigin: h.origin)
            _ = try await b.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await b.request("/x").status == 200)
            let app = TestBrowser(gatewayOrigin: h.origin)
            let nonce = try await app.request("/_auth/native/nonce", method: .POST, json: "{}")
            #expect(nonce.status == 200, "\(nonce.body)")
            let again = try await Self.flood(port: h.gatewayPort, source: "127.0.0.2", count: 1)
            #expect(again.statuses["login"] == [429: 1], "the flooder is still refused")
        }
    }

    @Test("many addresses flood: the instance cap bounds the store, 503 with Retry-After, and signed-in sessions go on")
    func floodFromManyAddresses() async throws {
        try await SignInHarness.with(store: .redis, configure: {
            $0.server.trustedProxies = [CIDR.parse("127.0.0.0/8")!]  // the flood arrives through a proxy, one forwarded address per request
            $0.apple?.maxPendingLogins = 100
        }) { h in
            let b = TestBrowser(gatewayOrigin: h.origin)
            _ = try await b.signIn(from: "/x", as: h.simulator.createUser())  // one login of the 100
            let botnet = (0..<500).map { "198.51.\($0 / 250).\($0 % 250 + 1)" }
            let flood = try await Self.flood(port: h.gatewayPort, source: "127.0.0.2", count: 500, forwardedFor: botnet)
            #expect(flood.unexpected.isEmpty, "\(flood.unexpected.prefix(5))")
            let admitted = (flood.statuses["login"]?[302] ?? 0) + (flood.statuses["native_nonce"]?[200] ?? 0)
            #expect(admitted == 99, "the cap less the real login: \(flood.statuses)")
            #expect(flood.statuses["login"]?[503] ?? 0 > 400 && flood.statuses["native_nonce"]?[503] ?? 0 > 400, "\(flood.statuses)")
            #expect(flood.retryAfters.allSatisfy { (500...600).contains($0) }, "until the 10-minute window ends: \(flood.retryAfters)")
            #expect(flood.refusedBodies["native_nonce"]?.contains("\"temporarily_unavailable\"") == true)
            let keys = try await Self.storedKeys(h)
            #expect(keys.logins + keys.nonces == 99, "at most the cap: \(keys)")
            #expect(try await b.request("/x").status == 200, "the session signed in before the flood goes on")
            h.clock.advance(by: .seconds(601))
            let late = TestBrowser(gatewayOrigin: h.origin)
            _ = try await late.signIn(from: "/x", as: h.simulator.createUser())
            #expect(try await late.request("/x").status == 200, "a new window: sign-ins start again")
        }
    }

    @Test("behind a trusted proxy each forwarded client has its own limit; a spoofed X-Forwarded-For from elsewhere counts as its sender")
    func forwardedClients() async throws {
        try await SignInHarness.with(configure: {
            $0.server.trustedProxies = [CIDR.parse("127.0.0.1/32")!]
            $0.apple?.loginsPerMinute = 3
        }) { h throws in  // (its only throwing calls are inside #expect, which a closure does not count)
            func logins(from source: String, forwardedFor: [String]) async throws -> [Int] {
                let port = h.gatewayPort
                return try await blocking {
                    let client = try RawClient(port: port, timeoutSeconds: 20, source: source)
                    return try forwardedFor.map { address in
                        try client.send("GET /_auth/login HTTP/1.1\r\nHost: localhost:\(port)\r\nX-Forwarded-For: \(address)\r\n\r\n")
                        return try client.readResponse().status
                    }
                }
            }
            let a = Array(repeating: "198.51.100.1", count: 4)
            #expect(try await logins(from: "127.0.0.1", forwardedFor: a) == [302, 302, 302, 429], "client A through the proxy")
            #expect(try await logins(from: "127.0.0.1", forwardedFor: ["203.0.113.5, 198.51.100.2"] + Array(repeating: "198.51.100.2", count: 3)) == [302, 302, 302, 429],
                    "client B through the same proxy: its own window (the hop it claims before it is its own)")
            #expect(try await logins(from: "127.0.0.1", forwardedFor: ["2001:db8:7:7::1", "2001:db8:7:7::2", "2001:db8:7:7:ffff::3", "2001:db8:7:7::4"]) == [302, 302, 302, 429],
                    "an IPv6 client counts by its /64")
            #expect(try await logins(from: "127.0.0.2", forwardedFor: ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"]) == [302, 302, 302, 429],
                    "not a trusted proxy: its X-Forwarded-For is its own claim, and it is one client")
        }
    }
}
