import AppleID
import AppleIDSimulator
import Foundation
import GatewayConfig
import NIOHTTP1
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// The sign-in endpoints' rules (issue 13 §1, §5): the endpoint table, failures mapped once,
/// the exchange rate limit, the native nonce.
@Suite("Sign-in rules")
struct SignInRulesTests {
    @Test("the endpoint table: unknown paths are no endpoint; each row lists its methods", arguments: [
        ("/sign-in", AuthEndpoint.signIn, [HTTPMethod.GET, .HEAD]), ("/login", .login, [.GET]), ("/callback", .callback, [.POST]),
        ("/native", .native, [.POST]), ("/native/nonce", .nativeNonce, [.POST]), ("/logout", .logout, [.GET, .POST]),
        ("/userinfo", .userinfo, [.GET]), ("/check", .check, [.GET, .HEAD]), ("/jwks.json", .jwks, [.GET]),
        ("/apple/notifications", .appleNotifications, [.POST]), ("/revoke", .revoke, [.POST]),
    ] as [(String, AuthEndpoint, [HTTPMethod])])
    func table(path: String, endpoint: AuthEndpoint, methods: [HTTPMethod]) {
        #expect(AuthEndpoint(path: Substring(path)) == endpoint)
        #expect(endpoint.methods == methods)
    }

    @Test("no endpoint", arguments: ["", "/", "/Sign-in", "/sign-in/", "/native/", "/native/nonce/x", "/apple", "/jwks"])
    func unknown(path: String) {
        #expect(AuthEndpoint(path: Substring(path)) == nil)
    }

    @Test("each failure has one status, metric outcome and JSON code", arguments: [
        (SignInFailure.malformed("x"), 400, SignInOutcome.rejected, "invalid_request"),
        (.notJSON, 415, .rejected, "invalid_request"),
        (.loginNotStarted, 400, .rejected, "invalid_grant"),
        (.loginExpired, 400, .rejected, "invalid_grant"),
        (.appleDeclined, 400, .rejected, "invalid_grant"),
        (.identityToken(.signature), 401, .rejected, "invalid_identity_token"),
        (.identityToken(.keysUnavailable), 502, .appleUnavailable, "apple_unavailable"),
        (.codeRefused, 400, .rejected, "invalid_grant"),
        (.otherUsersCode, 401, .rejected, "invalid_grant"),
        (.appleUnavailable, 502, .appleUnavailable, "apple_unavailable"),
        (.appleMisconfigured, 502, .appleMisconfigured, "apple_misconfigured"),
        (.storeUnavailable, 503, .storeUnavailable, "store_unavailable"),
        (.throttled(retryAfter: 7), 429, .throttled, "too_many_requests"),
        (.busy(retryAfter: 540), 503, .throttled, "temporarily_unavailable"),
        (.nonce("x"), 400, .rejected, "invalid_nonce"),
    ] as [(SignInFailure, Int, SignInOutcome, String)])
    func failures(failure: SignInFailure, status: Int, outcome: SignInOutcome, code: String) {
        #expect(Int(failure.status.code) == status)
        #expect(failure.outcome == outcome)
        #expect(failure.code == code)
        #expect(failure.json.status == failure.status)
        let page = failure.page(startAgain: "/_auth/sign-in?rd=%2F", clearing: [("set-cookie", "x=; Max-Age=0")])
        #expect(page.status == failure.status && page.headers.contains { $0.0 == "set-cookie" })
        let retryAfter: Int? = switch failure {
        case .throttled(let seconds), .busy(let seconds): seconds
        default: nil
        }
        if let retryAfter {
            #expect(failure.json.headers.contains { $0 == ("retry-after", String(retryAfter)) })
            #expect(page.headers.contains { $0 == ("retry-after", String(retryAfter)) })
        }
        #expect(!failure.page(startAgain: "/").headers.contains { $0.0 == "set-cookie" }, "a page that clears nothing")
    }

    @Test("a wait reads as a person says it", arguments: [(1, "1 second"), (45, "45 seconds"), (60, "1 minute"), (61, "2 minutes"), (600, "10 minutes")])
    func wait(seconds: Int, text: String) {
        #expect(SignInFailure.wait(seconds) == text)
    }

    @Test("Apple's answer to a code exchange maps to one failure", arguments: [
        (AppleTokenOutcome.grantRevoked(error: "invalid_grant"), SignInFailure.codeRefused),
        (.clientMisconfigured(error: "invalid_client"), .appleMisconfigured),
        (.transient(reason: "x"), .appleUnavailable),
        (.throttled(retryAfter: 60), .appleUnavailable),
    ] as [(AppleTokenOutcome, SignInFailure)])
    func exchangeOutcomes(outcome: AppleTokenOutcome, failure: SignInFailure) {
        #expect(outcome.signInFailure == failure)
    }

    /// One event for a rate window: its key, time (ms), limit and window (ms).
    struct RateEvent: Sendable {
        var key: String, t: Int64, limit: Int, window: Int64 = RateWindows.minute
        init(_ key: String, _ t: Int64, limit: Int, window: Int64 = RateWindows.minute) {
            (self.key, self.t, self.limit, self.window) = (key, t, limit, window)
        }
    }

    /// A named sequence of events and what `admit` answers each (nil: admitted; else the
    /// seconds until it may be).
    struct RateCase: CustomTestStringConvertible, Sendable {
        var name: String
        var capacity = 100_000
        var events: [RateEvent]
        var answers: [Int?]
        /// Keys the table holds after the last event.
        var kept: Int
        var testDescription: String { name }
    }

    static let rateCases: [RateCase] = [
        RateCase(name: "the limit per key per minute, then the seconds left",
                 events: [.init("a", 1000, limit: 3), .init("a", 1000, limit: 3), .init("a", 1000, limit: 3), .init("a", 1000, limit: 3), .init("a", 31_500, limit: 3)],
                 answers: [nil, nil, nil, 60, 30], kept: 1),
        RateCase(name: "keys are independent", events: [.init("a", 0, limit: 1), .init("a", 0, limit: 1), .init("b", 0, limit: 1)], answers: [nil, 60, nil], kept: 2),
        RateCase(name: "a window ends after its minute", events: [.init("a", 0, limit: 1), .init("a", 59_999, limit: 1), .init("a", 60_000, limit: 1)],
                 answers: [nil, 1, nil], kept: 1),
        RateCase(name: "a clock that went back starts a new window", events: [.init("a", 61_000, limit: 1), .init("a", 0, limit: 1)], answers: [nil, nil], kept: 1),
        RateCase(name: "0: no limit", events: [.init("c", 0, limit: 0), .init("c", 0, limit: 0), .init("c", 0, limit: 0)], answers: [nil, nil, nil], kept: 0),
        RateCase(name: "a window of its own length",
                 events: [.init("g", 0, limit: 2, window: 600_000), .init("g", 0, limit: 2, window: 600_000), .init("g", 0, limit: 2, window: 600_000),
                          .init("g", 599_500, limit: 2, window: 600_000), .init("g", 600_000, limit: 2, window: 600_000)],
                 answers: [nil, nil, 600, 1, nil], kept: 1),
        RateCase(name: "a full table refuses a new key until a window ends; known keys still count", capacity: 2,
                 events: [.init("a", 0, limit: 5), .init("b", 10_000, limit: 5), .init("c", 20_000, limit: 5), .init("a", 20_000, limit: 5),
                          .init("c", 60_000, limit: 5)],
                 answers: [nil, nil, 40, nil, nil], kept: 2),
        RateCase(name: "a full table is swept at most once a second", capacity: 1,
                 events: [.init("a", 0, limit: 5), .init("b", 60_000, limit: 5), .init("c", 60_500, limit: 5), .init("c", 120_000, limit: 5)],
                 answers: [nil, nil, 60, nil], kept: 1),
    ]

    @Test("rate windows: fixed windows per key, a bounded table", arguments: rateCases)
    func rateWindows(_ c: RateCase) {
        var w = RateWindows(capacity: c.capacity)
        let answers = c.events.map { w.admit($0.key, now: $0.t, limit: $0.limit, window: $0.window) }
        #expect(answers == c.answers)
        #expect(w.windows.count == c.kept)
    }

    /// A named sequence of anonymous writes (all at `t`, ms) under the two limits, and the
    /// verdict on each.
    struct WriteCase: CustomTestStringConvertible, Sendable {
        var name: String
        var perClient: Int
        var perInstance: Int
        var events: [(AnonymousWrites.Kind, String, Int64)]
        var verdicts: [AnonymousWrites.Verdict]
        var testDescription: String { name }
    }

    static let writeCases: [WriteCase] = [
        WriteCase(name: "a client over its limit is throttled; another client goes on", perClient: 2, perInstance: 100,
                  events: [(.login, "a", 0), (.login, "a", 0), (.login, "a", 30_000), (.login, "b", 30_000)],
                  verdicts: [.admitted, .admitted, .throttled(retryAfter: 30), .admitted]),
        WriteCase(name: "logins and nonces are counted apart", perClient: 1, perInstance: 100,
                  events: [(.login, "a", 0), (.nativeNonce, "a", 0), (.nativeNonce, "a", 0)],
                  verdicts: [.admitted, .admitted, .throttled(retryAfter: 60)]),
        WriteCase(name: "the instance cap refuses every client until its 10-minute window ends", perClient: 100, perInstance: 3,
                  events: [(.login, "a", 0), (.nativeNonce, "b", 0), (.login, "c", 0), (.login, "d", 1000), (.nativeNonce, "a", 599_000), (.login, "d", 600_000)],
                  verdicts: [.admitted, .admitted, .admitted, .busy(retryAfter: 599), .busy(retryAfter: 1), .admitted]),
        WriteCase(name: "a throttled client spends nothing of the cap", perClient: 1, perInstance: 2,
                  events: [(.login, "a", 0), (.login, "a", 0), (.login, "a", 0), (.login, "a", 0), (.login, "b", 0), (.login, "c", 0)],
                  verdicts: [.admitted, .throttled(retryAfter: 60), .throttled(retryAfter: 60), .throttled(retryAfter: 60), .admitted, .busy(retryAfter: 600)]),
        WriteCase(name: "0: no limit, no cap", perClient: 0, perInstance: 0,
                  events: Array(repeating: (.login, "a", 0), count: 5), verdicts: Array(repeating: .admitted, count: 5)),
    ]

    @Test("anonymous writes: a limit per client and a cap per instance", arguments: writeCases)
    func anonymousWrites(_ c: WriteCase) {
        var w = AnonymousWrites()
        let verdicts = c.events.map { w.admit($0.0, client: $0.1, now: $0.2, perClient: c.perClient, perInstance: c.perInstance) }
        #expect(verdicts == c.verdicts)
    }

    @Test("the key a per-client limit counts: IPv4 as it is, IPv6 by its /64", arguments: [
        ("203.0.113.9", "203.0.113.9"),
        ("::ffff:203.0.113.9", "203.0.113.9"),  // a dual-stack listener's IPv4 client
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2::99", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::99", "2001:db8:1:3::/64"),
        ("::1", "0:0:0:0::/64"),
        ("unknown", "unknown"),
    ])
    func limitKey(address: String, key: String) {
        #expect(ClientAddress.limitKey(address) == key)
    }

    @Test("the client behind trusted proxies: the nearest untrusted X-Forwarded-For hop, else the peer", arguments: [
        ("203.0.113.9", [], "203.0.113.9"),
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),  // an untrusted peer's header is its own claim
        ("10.0.0.2", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.2", ["6.6.6.6, 198.51.100.1"], "198.51.100.1"),  // the client's own prefix is ignored
        ("10.0.0.2", ["198.51.100.1, 10.0.0.3"], "198.51.100.1"),  // two trusted hops
        ("10.0.0.2", ["6.6.6.6", "198.51.100.1"], "198.51.100.1"),  // two header fields
        ("10.0.0.2", ["junk"], "10.0.0.2"),
        ("10.0.0.2", ["10.0.0.7"], "10.0.0.2"),
    ] as [(String, [String], String)])
    func clientAddress(peer: String, forwardedFor: [String], expected: String) {
        #expect(ClientAddress.resolve(peer: peer, forwardedFor: forwardedFor, trusted: [CIDR.parse("10.0.0.0/8")!]) == expected)
        #expect(ClientAddress.resolve(peer: nil, forwardedFor: forwardedFor, trusted: []) == "unknown")
    }

    // MARK: end to end

    @Test("native nonce required: issued, single use, bound to the app; the app may pass its SHA-256 to Apple")
    func nativeNonce() async throws {
        try await SignInHarness.with(configure: { $0.apple?.nativeNonce = .required }) { h in
            let sub = h.simulator.createUser()
            let app = TestBrowser(gatewayOrigin: h.origin)
            func issue(_ body: String = "") async throws -> [String: Any] {
                let r = try await app.request("/_auth/native/nonce", method: .POST, headers: [("accept", "application/json")], json: body)
                #expect(r.status == 200, "\(r.body)")
                return try #require(JSONSerialization.jsonObject(with: Data(r.body.utf8)) as? [String: Any])
            }
            func signIn(nonceInToken: String?, nonceSent: String?) async throws -> TestBrowser.Response {
                let auth = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nonceInToken)
                var fields = #""identity_token":"\#(auth.identityToken)","authorization_code":"\#(auth.authorizationCode)""#
                if let nonceSent { fields += #","nonce":"\#(nonceSent)""# }
                return try await app.request("/_auth/native", method: .POST, json: "{\(fields)}")
            }
            let issued = try await issue(#"{"client_id":"\#(SignInHarness.appClient)"}"#)
            let nonce = try #require(issued["nonce"] as? String)
            #expect(issued["nonce_sha256"] as? String == sha256Hex(nonce))
            // Apple's sample: the app passes SHA-256(nonce) to Apple and sends the nonce itself.
            #expect(try await signIn(nonceInToken: sha256Hex(nonce), nonceSent: nonce).status == 200)
            let replay = try await signIn(nonceInToken: sha256Hex(nonce), nonceSent: nonce)
            #expect(replay.status == 400 && replay.body.contains("invalid_nonce"), "single use: \(replay.body)")
            let missing = try await signIn(nonceInToken: nil, nonceSent: nil)
            #expect(missing.status == 400 && missing.body.contains("invalid_nonce"))
            let invented = try await signIn(nonceInToken: "mine", nonceSent: "mine")
            #expect(invented.status == 400 && invented.body.contains("invalid_nonce"), "a nonce the gateway never issued")
            let forWeb = try #require(try await issue(#"{"client_id":"\#(SignInHarness.webClient)"}"#)["nonce"] as? String)
            let otherApp = try await signIn(nonceInToken: forWeb, nonceSent: forWeb)
            #expect(otherApp.status == 400 && otherApp.body.contains("another app"))
            let plain = try #require(try await issue()["nonce"] as? String)
            let mismatch = try await signIn(nonceInToken: "something else", nonceSent: plain)
            #expect(mismatch.status == 401 && mismatch.body.contains("invalid_identity_token"), "the token must carry the nonce or its hash")
            // A token from a platform without nonces is not bound to the issued one: refused when required.
            h.simulator.setFaults { $0.nonceUnsupported = true }
            let unbound = try #require(try await issue()["nonce"] as? String)
            let noClaim = try await signIn(nonceInToken: unbound, nonceSent: unbound)
            #expect(noClaim.status == 401 && noClaim.body.contains("invalid_identity_token"), "\(noClaim.body)")
            h.simulator.setFaults { $0.nonceUnsupported = false }
            #expect(try await app.request("/_auth/native/nonce", method: .POST, json: #"{"client_id":"com.unknown"}"#).status == 400)
            #expect(try await app.request("/_auth/native/nonce", method: .GET).status == 405)
        }
    }

    @Test("exchanges per minute: a replayed identity token cannot make the gateway call Apple without end")
    func exchangeRateLimit() async throws {
        try await SignInHarness.with(configure: { $0.apple?.exchangesPerMinute = 3 }) { h in
            let sub = h.simulator.createUser()
            let auth = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nil)
            let app = TestBrowser(gatewayOrigin: h.origin)
            let before = h.simulator.grantCount("authorization_code")
            var statuses: [Int] = []
            for i in 0..<6 {  // the same token with junk codes
                let body = #"{"identity_token":"\#(auth.identityToken)","authorization_code":"junk-\#(i)"}"#
                let r = try await app.request("/_auth/native", method: .POST, json: body)
                statuses.append(r.status)
                if r.status == 429 { #expect(r.headers.first(name: "retry-after").flatMap(Int.init).map { $0 >= 1 && $0 <= 60 } == true) }
            }
            #expect(statuses == [400, 400, 400, 429, 429, 429], "\(statuses)")
            #expect(h.simulator.grantCount("authorization_code") - before == 3, "Apple was called three times, not six")
            h.clock.advance(by: .seconds(61))
            let fresh = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nil)
            let ok = try await app.request("/_auth/native", method: .POST, json: #"{"identity_token":"\#(fresh.identityToken)","authorization_code":"\#(fresh.authorizationCode)"}"#)
            #expect(ok.status == 200, "a new minute: \(ok.body)")
        }
    }
}

/// Apple's return URL is registered at Apple: a fleet that starts with another one fails every
/// sign-in there until it is registered (issue 28 §1). The store remembers the one the fleet
/// last started with.
@Suite("Apple's return URL across restarts")
struct ReturnURLTests {
    @Test("a gateway that starts with another return URL than the fleet's says so loudly; the same one is not mentioned")
    func movedReturnURL() async throws {
        try await SignInHarness.with(store: .redis) { h in
            let same = LogRecorder()
            _ = try await h.addInstance(logs: same)
            #expect(!same.all.contains { $0.contains("return URL changed") }, "\(same.all)")
            let moved = LogRecorder()
            _ = try await h.addInstance(logs: moved) { $0.server.publicURL = "https://new.example.com" }
            let line = moved.all.first { $0.hasPrefix("error Apple's return URL changed") }
            #expect(line?.contains("apple_return_url=https://new.example.com/_auth/callback") == true, "\(moved.all)")
            #expect(line?.contains("previous=\(h.origin)/_auth/callback") == true, "\(moved.all)")
        }
    }
}
