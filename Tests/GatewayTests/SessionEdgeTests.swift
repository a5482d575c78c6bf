import AppleIDSimulator
import Foundation
import NIOCore
import TestSupport
import Testing

@testable import Gateway

/// Issue 9's holes between the gateway's sessions and the app: the bearer token leaking
/// upstream, cross-origin posts to the gateway, sessions a new sign-in should end, cookies
/// planted before a login, and WebSocket tunnels outliving their session.
@Suite("Sessions at the edge", .serialized, .timeLimit(.minutes(3)))
struct SessionEdgeTests {
    /// A native sign-in: the session token.
    static func nativeToken(_ h: SignInHarness, sub: String, nonce: String, bearer: String? = nil) async throws -> String {
        let credential = try h.simulator.nativeAuthorization(sub: sub, clientID: SignInHarness.appClient, nonce: nonce)
        let app = TestBrowser(gatewayOrigin: h.origin)
        let body = #"{"identity_token":"\#(credential.identityToken)","authorization_code":"\#(credential.authorizationCode)","nonce":"\#(nonce)"}"#
        var headers = [("accept", "application/json")]
        if let bearer { headers.append(("authorization", "Bearer \(bearer)")) }
        let response = try await app.request("/_auth/native", method: .POST, headers: headers, json: body)
        #expect(response.status == 200, "\(response.body)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(response.body.utf8)) as? [String: Any])
        return try #require(object["token"] as? String)
    }

    @Test("the session's bearer token never reaches the app; other Authorization schemes do")
    func bearerStripped() async throws {
        try await SignInHarness.with { h in
            let token = try await Self.nativeToken(h, sub: h.simulator.createUser(), nonce: "n-1")
            let api = TestBrowser(gatewayOrigin: h.origin)
            for path in ["/api/items", "/public/page", "/maybe/page"] {
                let call = try await api.request(path, headers: [("accept", "application/json"), ("authorization", "Bearer \(token)")])
                #expect(call.status == 200, "\(path)")
                #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["authorization"].isEmpty, "\(path): the session token reached the app")
            }
            // A junk bearer first does not hide the session's token behind it.
            _ = try await api.request("/public/page", headers: [("authorization", "Bearer junk"), ("authorization", "Bearer \(token)")])
            #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["authorization"].isEmpty)
            // The app's own credentials pass untouched.
            for value in ["Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Bearer app-own-jwt"] {
                _ = try await api.request("/public/page", headers: [("authorization", value)])
                #expect(h.upstream.stats.withLockedValue { $0.lastHeaders }["authorization"] == [value])
            }
            // A cookie and a bearer token naming different sessions: neither counts.
            let other = try await Self.nativeToken(h, sub: h.simulator.createUser(), nonce: "n-2")
            let mixed = try await api.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer \(token)"),
                                                                      ("cookie", "__Host-sessiongate=\(other)")], sendCookies: false)
            #expect(mixed.status == 401)
        }
    }

    @Test("cross-origin posts to the gateway's state-changing endpoints are refused; Apple's callback is not")
    func crossOriginPosts() async throws {
        try await SignInHarness.with { h in
            let browser = TestBrowser(gatewayOrigin: h.origin)
            // Apple's form_post arrives cross-site, with Apple's Origin: accepted.
            let (_, post) = try await browser.signIn(from: "/x", as: h.simulator.createUser(), stopBeforeCallback: true)
            let callback = try await browser.request(post.action, method: .POST, headers: [("accept", "text/html"), ("origin", h.simulator.baseURL)], form: post.fields)
            #expect(callback.status == 303)
            for (path, origin) in [("/_auth/revoke", "https://evil.example"), ("/_auth/logout", "http://sibling.localhost:\(h.gatewayPort)"),
                                   ("/_auth/revoke", "null"), ("/_auth/native", "https://evil.example")] {
                let answer = try await browser.request(path, method: .POST, headers: [("accept", "text/html"), ("origin", origin)], form: [])
                #expect(answer.status == 403, "\(path) from \(origin)")
            }
            #expect(try await browser.request("/x").status == 200, "the refused posts changed nothing")
            // A form body (all a cross-site form can send without a preflight) is refused for its type.
            let plain = try await browser.request("/_auth/native", method: .POST, form: [("identity_token", "x")])
            #expect(plain.status == 415)
            // The gateway's own origin may post.
            let out = try await browser.request("/_auth/logout", method: .POST, headers: [("accept", "text/html"), ("origin", h.origin)], form: [])
            #expect(out.status == 303)
            #expect(try await browser.request("/x").status == 302)
        }
    }

    @Test("a new sign-in ends the session the browser or app had; the login start clears the session cookie")
    func reloginEndsPrevious() async throws {
        try await SignInHarness.with { h in
            let sub = h.simulator.createUser()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            _ = try await browser.signIn(from: "/x", as: sub)
            let first = try #require(browser.cookies["__Host-sessiongate"])
            browser.setCookies = []
            _ = try await browser.signIn(from: "/x", as: sub)
            #expect(browser.setCookies.contains { $0.hasPrefix("__Host-sessiongate=;") && $0.contains("Max-Age=0") }, "the login start clears the session cookie")
            let second = try #require(browser.cookies["__Host-sessiongate"])
            #expect(second != first)
            let old = TestBrowser(gatewayOrigin: h.origin)
            old.cookies["__Host-sessiongate"] = first
            #expect(try await old.request("/x").status == 302, "the replaced session still works")
            #expect(try await browser.request("/x").status == 200)

            // Native: signing in again with the old token presented ends it.
            let a = try await Self.nativeToken(h, sub: sub, nonce: "n-a")
            let b = try await Self.nativeToken(h, sub: sub, nonce: "n-b", bearer: a)
            let api = TestBrowser(gatewayOrigin: h.origin)
            #expect(try await api.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer \(a)")]).status == 401)
            #expect(try await api.request("/api/items", headers: [("accept", "application/json"), ("authorization", "Bearer \(b)")]).status == 200)
        }
    }

    @Test("a WebSocket tunnel closes at its session's absolute expiry")
    func tunnelClosesAtExpiry() async throws {
        try await SignInHarness.with(configure: { $0.session.absoluteTimeout = .seconds(3) }) { h in
            let (_, cookie) = try await Self.signedIn(h)
            let port = h.gatewayPort
            let (closed, lived) = try await blocking { () -> (Bool, Duration) in
                let client = try RawClient(port: port, timeoutSeconds: 20)
                try client.send(Self.handshake(port: port, cookie: cookie))
                guard try client.readResponse().status == 101 else { return (false, .zero) }
                let opened = ContinuousClock.now
                try client.send("ping")
                guard try client.read(count: 4) == Array("ping".utf8) else { return (false, .zero) }
                return (client.waitForClose(), ContinuousClock.now - opened)
            }
            #expect(closed, "the tunnel outlived its session's absolute expiry")
            #expect(lived > .seconds(1), "closed long before the session's expiry: \(lived)")
            #expect(try await Self.registryEmpties(h.service))
        }
    }

    @Test("a WebSocket tunnel closes when its session is revoked or logged out", arguments: ["revoke", "logout"])
    func tunnelClosesWithSession(how: String) async throws {
        try await SignInHarness.with { h in
            let (browser, cookie) = try await Self.signedIn(h)
            let port = h.gatewayPort
            let client = try await blocking { () -> RawClient in
                let client = try RawClient(port: port, timeoutSeconds: 20)
                try client.send(Self.handshake(port: port, cookie: cookie))
                #expect(try client.readResponse().status == 101)
                try client.send("ping")
                #expect(try client.read(count: 4) == Array("ping".utf8))
                return client
            }
            #expect(h.service.core.tunnels.count == 1)
            let ended = try await browser.request("/_auth/\(how)", method: .POST, form: [])
            #expect(ended.status == 303)
            let closed = try await blocking { client.waitForClose() }
            #expect(closed, "the tunnel outlived its session")
            #expect(try await Self.registryEmpties(h.service))
        }
    }

    /// A browser signed in as a new user, and its session cookie.
    static func signedIn(_ h: SignInHarness) async throws -> (TestBrowser, String) {
        let browser = TestBrowser(gatewayOrigin: h.origin)
        _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
        return (browser, try #require(browser.cookies["__Host-sessiongate"]))
    }

    /// A signed-in browser's session cookie, sent in a raw WebSocket handshake for `path`.
    static func handshake(port: Int, cookie: String, path: String = "/ws", extra: String = "") -> String {
        "GET \(path) HTTP/1.1\r\nHost: localhost:\(port)\r\nCookie: __Host-sessiongate=\(cookie)\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\(extra)\r\n"
    }

    /// A WebSocket tunnel opened with a raw handshake (the 101 read).
    static func openTunnel(port: Int, cookie: String) async throws -> RawClient {
        try await blocking { () -> RawClient in
            let client = try RawClient(port: port, timeoutSeconds: 20)
            try client.send(Self.handshake(port: port, cookie: cookie))
            #expect(try client.readResponse().status == 101)
            return client
        }
    }

    /// The registry forgets every tunnel once it is gone (closed, refused, never opened).
    static func registryEmpties(_ service: GatewayService) async throws -> Bool {
        for _ in 0..<500 {
            if service.core.tunnels.count == 0 { return true }
            try await Task.sleep(for: .milliseconds(10))
        }
        return false
    }

    @Test("a tunnel open on instance B closes when the user is revoked on instance A (Redis pub/sub)")
    func tunnelClosesAcrossInstances() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600)) { h in
            let b = try await h.addInstance()
            let (browser, cookie) = try await Self.signedIn(h)
            let portB = try #require(Int(b.origin.split(separator: ":").last ?? ""))
            let client = try await Self.openTunnel(port: portB, cookie: cookie)
            #expect(try await browser.request("/_auth/revoke", method: .POST, form: []).status == 303)
            #expect(try await blocking { client.waitForClose() }, "the tunnel on B outlived the revocation on A")
            #expect(try await Self.registryEmpties(b.service))
        }
    }

    @Test("a revocation no message announced (the subscriber was away) still closes the tunnel once the subscriber is back")
    func tunnelRecheckedAfterResubscribe() async throws {
        try await SignInHarness.with(store: .redis, localCacheTTL: .seconds(3600)) { h in
            let redis = try #require(h.redis)
            let b = try await h.addInstance()
            let browser = TestBrowser(gatewayOrigin: h.origin)
            let sub = h.simulator.createUser()
            _ = try await browser.signIn(from: "/x", as: sub)
            let cookie = try #require(browser.cookies["__Host-sessiongate"])
            let portB = try #require(Int(b.origin.split(separator: ":").last ?? ""))
            let client = try await Self.openTunnel(port: portB, cookie: cookie)
            // The user is revoked in the store, and no invalidation is published (as when it was
            // published while this instance's subscriber was disconnected, or not yet subscribed).
            let revokedAt = Int64(Date().timeIntervalSince1970 * 1000) + 60_000
            _ = try RedisCommand.send(["SET", "\(h.configuration.store.keyPrefix)revoked:{\(sub)}", "\(revokedAt)"], port: redis.port)
            // Every subscriber loses its connection and reconnects.
            _ = try RedisCommand.send(["CLIENT", "KILL", "TYPE", "pubsub"], port: redis.port)
            #expect(try await blocking { client.waitForClose() }, "the tunnel outlived a revocation made while no message could reach it")
            #expect(try await Self.registryEmpties(b.service))
        }
    }

    @Test("refused and failed handshakes leave nothing in the registry")
    func registryAfterRefusals() async throws {
        try await SignInHarness.with { h in
            let (_, cookie) = try await Self.signedIn(h)
            let port = h.gatewayPort
            let statuses = try await blocking { () -> [Int] in
                var statuses: [Int] = []
                // The upstream answers this one with a plain 200 (no upgrade), and refuses the origin of the next.
                for extra in ["", "Origin: https://evil.example\r\n"] {
                    let client = try RawClient(port: port, timeoutSeconds: 10)
                    try client.send(Self.handshake(port: port, cookie: cookie, path: "/x", extra: extra))
                    statuses.append(try client.readResponse().status)
                }
                return statuses
            }
            #expect(statuses == [200, 403])
            #expect(try await Self.registryEmpties(h.service))
        }
    }
}
