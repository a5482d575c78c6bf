import Foundation
@testable import Gateway
import HTTPProxy
import NIOHTTP1
import Sessions
import Testing

/// Issue 39 §1: a sign-in that starts on any routed host ends on that host, signed in, after one
/// trip to Apple (whose return URL stays at `public_url`). The gateway is `localhost` (its
/// `public_url`); the other hosts reach the same listener as `127.0.0.1` (an unrelated domain:
/// the one-time ticket) and as `other.localhost` (a sibling under `session.cookie_domain`).
@Suite("Sign-in on every routed host", .serialized, .timeLimit(.minutes(2)))
struct HostSignInTests {
    static func routes(_ c: inout GatewayConfiguration, host: String) {
        let up = c.routes[0].upstream
        c.routes.insert(.init(name: "elsewhere", host: host, pathPrefix: "/", upstream: up, auth: .required, unauthenticated: .redirect), at: 0)
    }

    /// Starts on `other` (a browser jar for that host): the protected page, the sign-in page's
    /// login there, which hands over to `public_url`'s login; returns that hand-over.
    static func start(on other: TestBrowser, host: [(String, String)] = []) async throws -> TestBrowser.Response {
        let page = try await other.request("/app/page?x=1", headers: [("accept", "text/html")] + host)
        #expect(page.status == 302)
        #expect(page.location == "/_auth/sign-in?rd=%2Fapp%2Fpage%3Fx%3D1")
        return try await other.request("/_auth/login?rd=%2Fapp%2Fpage%3Fx%3D1", headers: [("accept", "text/html")] + host)
    }

    @Test("a sign-in started on an unrelated routed host ends there by a one-time ticket, bound to the browser, once; logout ends it on both hosts",
          arguments: StoreChoice.allCases)
    func unrelatedHost(store: StoreChoice) async throws {
        try await SignInHarness.with(store: store.store, configure: { Self.routes(&$0, host: "127.0.0.1") }) { h in
            let ticketUser = h.simulator.createUser(privateEmail: false, firstName: "Tia", lastName: "Ket")
            let otherOrigin = "http://127.0.0.1:\(h.gatewayPort)"
            let other = TestBrowser(gatewayOrigin: otherOrigin)
            let main = TestBrowser(gatewayOrigin: h.origin)
            let handOver = try await Self.start(on: other)
            #expect(handOver.status == 302)
            let login = try #require(handOver.location)
            #expect(login.hasPrefix(h.origin + "/_auth/login?rd=" + FormBody.escape(otherOrigin + "/app/page?x=1") + "&bind="))
            let ticketCookie = try #require(other.cookies["__Host-sessiongate-ticket"])
            #expect(login.hasSuffix("&bind=" + sha256Hex(ticketCookie)), "the login carries the hash, never the cookie")

            let (callback, _) = try await main.signIn(login: login, as: ticketUser)
            var redeemURL = try #require(callback?.location)
            #expect(redeemURL.hasPrefix(otherOrigin + "/_auth/redeem?ticket="))
            #expect(callback?.headers["referrer-policy"] == ["no-referrer"])
            #expect(!redeemURL.contains(try #require(main.cookies["__Host-sessiongate"])), "the session is sealed in the ticket, not readable")

            // Another host cannot open the link; another browser (no ticket cookie) cannot use it,
            // and its try spends it: the first presentation uses a ticket up, whoever makes it.
            let wrongHost = try await main.request(redeemURL.replacingOccurrences(of: otherOrigin, with: h.origin))
            #expect(wrongHost.status == 400, "sealed for 127.0.0.1: it does not open on localhost")
            let stranger = TestBrowser(gatewayOrigin: otherOrigin)
            let stolen = try await stranger.request(redeemURL)
            #expect(stolen.status == 400 && stranger.cookies["__Host-sessiongate"] == nil)
            #expect(stolen.body.contains("another browser"))
            let spent = try await other.request(redeemURL)
            #expect(spent.status == 400 && spent.body.contains("already used") && other.cookies["__Host-sessiongate"] == nil)
            try await Self.again(other, main, ticketUser) { redeemURL = $0 }

            let redeemed = try await other.request(redeemURL)
            #expect(redeemed.status == 303)
            #expect(redeemed.location == "/app/page?x=1")
            #expect(redeemed.headers["referrer-policy"] == ["no-referrer"])
            let cookieLine = try #require(redeemed.headers["set-cookie"].first { $0.hasPrefix("__Host-sessiongate=") })
            #expect(!cookieLine.contains("Domain="), "host-only on the host it started on")
            #expect(other.cookies["__Host-sessiongate-ticket"] == nil, "the ticket cookie is used up")
            let page = try await other.request("/app/page?x=1")
            #expect(page.status == 200)
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-user"] == [ticketUser])

            // Once: a replay of the same link in the same browser is refused.
            other.cookies["__Host-sessiongate-ticket"] = ticketCookie
            let replay = try await other.request(redeemURL)
            #expect(replay.status == 400 && replay.body.contains("already used"))
            // The ticket cookie is the gateway's: the app never sees it.
            other.cookies["__Host-sessiongate-ticket"] = ticketCookie
            #expect(try await other.request("/app/page").status == 200)
            let cookieHeader = h.upstream.stats.withLockedValue { $0.lastHeaders }["cookie"].joined()
            #expect(!cookieHeader.contains("sessiongate"), "\(cookieHeader)")

            // One session on both hosts: signing out on either ends it on the other.
            // The confirm page's form must post with its Origin: under `no-referrer` Chromium sends
            // `Origin: null`, which the origin check refuses (found by the browser test).
            let confirm = try await other.request("/_auth/logout")
            #expect(confirm.headers["referrer-policy"] == ["same-origin"])
            let signedOut = try await other.request("/_auth/logout", method: .POST, headers: [("accept", "text/html"), ("origin", otherOrigin)])
            #expect(signedOut.status == 303)
            let onMain = try await main.request("/app/page")
            #expect(onMain.status == 302, "the session ended on public_url's host too")
        }
    }

    /// A second sign-in from the same host page (its ticket spent by someone else's try).
    static func again(_ other: TestBrowser, _ main: TestBrowser, _ sub: String, _ ticket: (String) -> Void) async throws {
        let login = try #require(try await start(on: other).location)
        ticket(try #require(try await main.signIn(login: login, as: sub).callback?.location))
    }

    @Test("a ticket is refused once its minute has passed")
    func ticketExpires() async throws {
        try await SignInHarness.with(configure: { Self.routes(&$0, host: "127.0.0.1") }) { h in
            let lateUser = h.simulator.createUser(privateEmail: false, firstName: "Lat", lastName: "E")
            let other = TestBrowser(gatewayOrigin: "http://127.0.0.1:\(h.gatewayPort)")
            let main = TestBrowser(gatewayOrigin: h.origin)
            let login = try #require(try await Self.start(on: other).location)
            let redeemURL = try #require(try await main.signIn(login: login, as: lateUser).callback?.location)
            h.clock.advance(by: .seconds(61))
            let late = try await other.request(redeemURL)
            #expect(late.status == 400 && other.cookies["__Host-sessiongate"] == nil)
        }
    }

    @Test("a redeem the store cannot answer is 503 within store.timeout, and sets no cookie")
    func redeemStoreDown() async throws {
        try await SignInHarness.withOwnRedis(storeTimeout: .seconds(1), configure: { Self.routes(&$0, host: "127.0.0.1") }) { h, redis in
            let user = h.simulator.createUser()
            let other = TestBrowser(gatewayOrigin: "http://127.0.0.1:\(h.gatewayPort)")
            let login = try #require(try await Self.start(on: other).location)
            let redeemURL = try #require(try await TestBrowser(gatewayOrigin: h.origin).signIn(login: login, as: user).callback?.location)
            redis.freeze()
            defer { redis.thaw() }
            let answer = try await other.request(redeemURL)
            #expect(answer.status == 503 && answer.body.contains("Sign in is unavailable"))
            #expect(other.cookies["__Host-sessiongate"] == nil)
            #expect(answer.headers["referrer-policy"] == ["no-referrer"])
        }
    }

    @Test("a sign-in started on a host under session.cookie_domain shares the session cookie: no ticket")
    func siblingHost() async throws {
        try await SignInHarness.with(configure: { c in
            Self.routes(&c, host: "other.localhost")
            c.session.cookieName = "__Secure-sessiongate"
            c.session.cookieDomain = "localhost"
        }) { h in
            let siblingUser = h.simulator.createUser(privateEmail: false, firstName: "Sib", lastName: "Ling")
            let host = [("host", "other.localhost:\(h.gatewayPort)")]
            let other = TestBrowser(gatewayOrigin: "http://127.0.0.1:\(h.gatewayPort)")
            let main = TestBrowser(gatewayOrigin: h.origin)
            let handOver = try await Self.start(on: other, host: host)
            let login = try #require(handOver.location)
            #expect(login == h.origin + "/_auth/login?rd=" + FormBody.escape("http://other.localhost:\(h.gatewayPort)/app/page?x=1"))
            #expect(other.cookies.isEmpty, "no ticket cookie")
            let (callback, _) = try await main.signIn(login: login, as: siblingUser)
            #expect(callback?.location == "http://other.localhost:\(h.gatewayPort)/app/page?x=1")
            let line = try #require(callback?.headers["set-cookie"].first { $0.hasPrefix("__Secure-sessiongate=") })
            #expect(line.contains("; Domain=localhost;"))
            // The browser sends a Domain=localhost cookie to other.localhost.
            other.cookies["__Secure-sessiongate"] = main.cookies["__Secure-sessiongate"]
            let page = try await other.request("/app/page?x=1", headers: [("accept", "text/html")] + host)
            #expect(page.status == 200)
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["x-auth-user"] == [siblingUser])
            // Logout clears the shared cookie where it was set.
            let out = try await main.request("/_auth/logout", method: .POST, headers: [("accept", "text/html"), ("origin", h.origin)])
            #expect(out.headers["set-cookie"].contains { $0.hasPrefix("__Secure-sessiongate=;") && $0.contains("Domain=localhost") && $0.contains("Max-Age=0") })
            let after = try await other.request("/app/page?x=1", headers: [("accept", "text/html")] + host)
            #expect(after.status == 302)
        }
    }

    @Test("a login on a routed host returning to an allowed host elsewhere starts at public_url's login, without a ticket")
    func elsewhereReturn() async throws {
        try await SignInHarness.with(configure: { Self.routes(&$0, host: "127.0.0.1") }) { h in
            let other = TestBrowser(gatewayOrigin: "http://127.0.0.1:\(h.gatewayPort)")
            let login = try await other.request("/_auth/login?rd=" + FormBody.escape("https://docs.example.com/guide"))
            #expect(login.status == 302)
            #expect(login.location == h.origin + "/_auth/login?rd=" + FormBody.escape("https://docs.example.com/guide"))
            #expect(other.cookies.isEmpty)
            // On public_url's own host nothing changed: the login goes to Apple.
            let own = try await TestBrowser(gatewayOrigin: h.origin).request("/_auth/login?rd=%2Fx")
            #expect(own.location?.hasPrefix(h.simulator.baseURL + "/auth/authorize?") == true)
        }
    }

    @Test("rd may name a routed host but no other plain-http host")
    func returnPolicy() {
        let policy = ReturnURLPolicy(origin: "http://localhost:8080", allowedHosts: ["docs.example.com", "127.0.0.1"], plainHTTPHosts: ["127.0.0.1"])
        #expect(policy.validate("http://127.0.0.1:8080/x") == "http://127.0.0.1:8080/x")
        #expect(policy.validate("http://docs.example.com/x") == nil, "allowed_redirect_hosts stay https only")
        #expect(policy.validate("https://docs.example.com/x") == "https://docs.example.com/x")
        #expect(policy.validate("http://evil.example/x") == nil)
        let tls = ReturnURLPolicy(origin: "https://app.example.com", allowedHosts: ["other.example.net"])
        #expect(tls.validate("http://other.example.net/x") == nil)
    }
}
