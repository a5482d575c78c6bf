import AppleIDSimulator
import Crypto
import Foundation
import GatewayConfig
import HTTPProxy
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Sessions
import TestSupport
import Testing

@testable import Gateway

/// A stand-in for the app's event endpoint: records every POST, answers 503 while `down`.
final class EventReceiver: Sendable {
    struct Received: Sendable {
        var type: String?
        var body: String
        var traceparent: String? = nil
    }

    private let state = NIOLockedValueBox<(received: [Received], down: Bool, waiters: [(Int, CheckedContinuation<Void, Never>)])>(([], false, []))
    private let server: SimpleHTTPServer
    let url: String

    private init(server: SimpleHTTPServer, url: String) {
        self.server = server
        self.url = url
    }

    /// Runs `body` with a started receiver, stopped before this returns or rethrows.
    static func with<Result>(_ body: (EventReceiver) async throws -> Result) async throws -> Result {
        try await withTeardown(try await start(), stop: { await $0.stop() }, body)
    }

    private static func start() async throws -> EventReceiver {
        let box = NIOLockedValueBox<EventReceiver?>(nil)
        let server = try await SimpleHTTPServer.start(host: "127.0.0.1", port: 0, group: MultiThreadedEventLoopGroup.singleton) { request in
            box.withLockedValue { $0 }?.receive(request) ?? SimpleResponse(status: .serviceUnavailable, "starting")
        }
        let receiver = EventReceiver(server: server, url: "http://127.0.0.1:\(server.localAddress?.port ?? 0)/events")
        box.withLockedValue { $0 = receiver }
        return receiver
    }

    private func receive(_ request: SimpleRequest) -> SimpleResponse {
        let down = state.withLockedValue { $0.down }
        if down { return SimpleResponse(status: .serviceUnavailable, "down") }
        let record = Received(type: request.head.headers.first(name: "x-sessiongate-event"), body: String(buffer: request.body),
                              traceparent: request.head.headers.first(name: "traceparent"))
        let ready = state.withLockedValue { s -> [CheckedContinuation<Void, Never>] in
            s.received.append(record)
            let (due, waiting) = (s.waiters.filter { $0.0 <= s.received.count }, s.waiters.filter { $0.0 > s.received.count })
            s.waiters = waiting
            return due.map(\.1)
        }
        for c in ready { c.resume() }
        return SimpleResponse(status: .noContent, "")
    }

    var received: [Received] { state.withLockedValue { $0.received } }

    func setDown(_ down: Bool) { state.withLockedValue { $0.down = down } }

    /// Waits until `count` events have arrived (or `limit` passed); answers what arrived.
    func waitFor(_ count: Int, within limit: Duration = .seconds(10)) async -> [Received] {
        let timeout = Task {
            try await Task.sleep(for: limit)
            let stuck = self.state.withLockedValue { s -> [CheckedContinuation<Void, Never>] in
                defer { s.waiters = [] }
                return s.waiters.map(\.1)
            }
            for c in stuck { c.resume() }
        }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = state.withLockedValue { s -> Bool in
                if s.received.count >= count { return true }
                s.waiters.append((count, c))
                return false
            }
            if now { c.resume() }
        }
        timeout.cancel()
        return received
    }

    func stop() async { await server.close() }
}

/// `events.url` (issue 13 §4): the app hears of deletions, revocations, email changes and ended
/// sessions, signed with the identity-assertion key, at least once.
@Suite("Events for the app", .serialized, .timeLimit(.minutes(2)))
struct AppEventsTests {
    /// The claims of an event, after checking its signature against `/_auth/jwks.json`, its
    /// own `typ` and its lifetime.
    static func verified(_ event: EventReceiver.Received, gateway: TestBrowser) async throws -> [String: Any] {
        let body = try #require(try JSONSerialization.jsonObject(with: Data(event.body.utf8)) as? [String: Any])
        let token = try #require(body["payload"] as? String)
        let header = try #require(Base64URLTest.decode(String(token.split(separator: ".")[0])))
        #expect(String(decoding: header, as: UTF8.self).contains(#""typ":"sessiongate-event+jwt""#), "never mistaken for an identity assertion")
        let claims = try await Base64URLTest.verifiedClaims(token, gateway: gateway)
        let (iat, exp) = (Self.number(claims["iat"]), Self.number(claims["exp"]))
        #expect(iat != nil && exp == iat.map { $0 + 300 }, "valid five minutes from its delivery")
        return claims
    }

    static func number(_ value: Any?) -> Int64? { (value as? NSNumber)?.int64Value }

    static func with<Result>(_ receiver: EventReceiver, store: SignInHarness.Store = .memory, deletions: EventReceiver? = nil,
                             _ body: (SignInHarness) async throws -> Result) async throws -> Result {
        try await SignInHarness.with(store: store, assertion: true, configure: { c in
            c.events.url = receiver.url
            if let deletions { c.events.urls["user.deleted"] = deletions.url }
        }, body)
    }

    @Test("each kind reaches the app, signed: session ended, email changed, revoked, deleted (to its own URL)")
    func kinds() async throws {
        try await EventReceiver.with { receiver in
            try await EventReceiver.with { deletions in
                try await Self.with(receiver, deletions: deletions) { h in
                    let sub = h.simulator.createUser()
                    let browser = TestBrowser(gatewayOrigin: h.origin)
                    _ = try await browser.signIn(from: "/x", as: sub)
                    #expect(try await browser.request("/_auth/logout", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
                    let ended = try await Self.verified(try #require(await receiver.waitFor(1).first), gateway: browser)
                    #expect(ended["type"] as? String == "session.ended" && ended["sub"] as? String == sub && ended["reason"] as? String == "logout")
                    #expect(ended["iss"] as? String == h.origin && ended["aud"] as? String == receiver.url && (ended["jti"] as? String)?.isEmpty == false)
                    #expect((ended["session"] as? String)?.count == 12, "a short store key, never the session id")

                    let url = h.origin + "/_auth/apple/notifications"
                    _ = try await browser.signIn(from: "/x", as: sub)
                    #expect(await h.simulator.sendNotification(.emailDisabled, sub: sub, to: url, retryDelays: []).status == 200)
                    let changed = try await Self.verified(try #require(await receiver.waitFor(2).last), gateway: browser)
                    #expect(changed["type"] as? String == "user.email_changed" && changed["email_forwarding"] as? String == "disabled")

                    h.clock.advance(by: .seconds(10))
                    let happened = h.clock.now() / 1000 - 5  // Apple's event_time (seconds): after the sign-in, before now
                    #expect(await h.simulator.sendNotification(.consentRevoked, sub: sub, to: url, eventTime: happened, retryDelays: []).status == 200)
                    let revoked = try await Self.verified(try #require(await receiver.waitFor(3).last), gateway: browser)
                    #expect(revoked["type"] as? String == "user.revoked" && revoked["reason"] as? String == "consent_revoked")
                    #expect(Self.number(revoked["event_time"]) == happened * 1000 + 999, "when Apple says it happened (the end of its second)")
                    #expect((Self.number(revoked["processed_at"]) ?? 0) >= happened * 1000, "when the gateway acted, separately")

                    _ = try await browser.signIn(from: "/x", as: sub)
                    #expect(await h.simulator.sendNotification(.accountDelete, sub: sub, to: url, retryDelays: []).status == 200)
                    let deleted = try await Self.verified(try #require(await deletions.waitFor(1).first), gateway: browser)
                    #expect(deleted["type"] as? String == "user.deleted" && deleted["reason"] as? String == "account_deleted" && deleted["aud"] as? String == deletions.url)
                    #expect(receiver.received.allSatisfy { $0.type != "user.deleted" }, "user.deleted goes to its own URL")
                    #expect(receiver.received.map(\.type) == ["session.ended", "user.email_changed", "user.revoked"])
                }
            }
        }
    }

    @Test("the app down for a while: events wait in the store's outbox and arrive once it is back")
    func receiverDown() async throws {
        try await EventReceiver.with { receiver in
            try await Self.with(receiver, store: .redis) { h in
                // The test drives the outbox's passes itself: its timer would race them. The session
                // clock stands still, so that no backoff runs out while a loaded machine signs the three
                // users in (a full parallel run took longer than the first backoff, and a job was due).
                h.service.core.outbox.stop()
                h.clock.freeze()
                receiver.setDown(true)
                var subs: [String] = []
                for _ in 0..<3 {
                    let sub = h.simulator.createUser()
                    subs.append(sub)
                    let browser = TestBrowser(gatewayOrigin: h.origin)
                    _ = try await browser.signIn(from: "/x", as: sub)
                    #expect(try await browser.request("/_auth/revoke", method: .POST, headers: [("accept", "application/json")], form: []).status == 204,
                            "the app being down never blocks the user")
                }
                let outbox = h.service.core.outbox
                // Each event's first attempt runs in the background: wait until all three have failed once.
                var pending: [OutboxJob] = []
                for _ in 0..<500 {
                    pending = try await h.service.core.store.jobs(on: outbox.loop).get().filter { $0.kind == .event }
                    if pending.count == 3, pending.allSatisfy({ $0.attempts == 1 }) { break }
                    try await Task.sleep(for: .milliseconds(10))
                }
                #expect(pending.count == 3 && pending.allSatisfy { $0.attempts == 1 }, "\(pending.map(\.attempts))")
                #expect(receiver.received.isEmpty)
                receiver.setDown(false)
                #expect(await outbox.runDue().isEmpty, "not due before the backoff")
                h.clock.advance(by: .seconds(6))
                #expect(await outbox.runDue().count == 3)
                let delivered = await receiver.waitFor(3)
                #expect(Set(delivered.map(\.type)) == ["user.revoked"] && delivered.count == 3, "a disconnect is not a deletion")
                var told: Set<String> = []
                for event in delivered { told.insert(try await Self.verified(event, gateway: TestBrowser(gatewayOrigin: h.origin))["sub"] as? String ?? "") }
                #expect(told == Set(subs))
                #expect(try await h.service.core.store.jobs(on: outbox.loop).get().isEmpty)
            }
        }
    }

    @Test("an event queued before the assertion key was rotated verifies with the new key set: it is signed when it is sent")
    func keyRotation() async throws {
        try await EventReceiver.with { receiver in
            try await Self.with(receiver, store: .redis) { h in
                h.service.core.outbox.stop()
                h.clock.freeze()
                receiver.setDown(true)
                let browser = TestBrowser(gatewayOrigin: h.origin)
                _ = try await browser.signIn(from: "/x", as: h.simulator.createUser())
                #expect(try await browser.request("/_auth/logout", method: .POST, headers: [("accept", "application/json")], form: []).status == 204)
                await h.service.core.outbox.drain()  // its first attempt failed: queued
                // The fleet restarts with a new key (the instance below shares the store).
                let rotated = h.directory + "/assertion-2.pem"
                try P256.Signing.PrivateKey().pemRepresentation.write(toFile: rotated, atomically: true, encoding: .utf8)
                let b = try await h.addInstance { $0.identity.assertion.keyFile = .file(rotated) }
                b.service.core.outbox.stop()
                receiver.setDown(false)
                h.clock.advance(by: .seconds(6))
                #expect(await b.service.core.outbox.runDue().count == 1)
                let delivered = try #require(await receiver.waitFor(1).first)
                let claims = try await Self.verified(delivered, gateway: TestBrowser(gatewayOrigin: b.origin))
                #expect(claims["type"] as? String == "session.ended")
            }
        }
    }

    @Test("a late consent-revoked for a user who signed in again since is not told to the app: the gateway ignored it")
    func supersededRevocation() async throws {
        try await EventReceiver.with { receiver in
            try await Self.with(receiver) { h in
                let sub = h.simulator.createUser()
                let before = TestBrowser(gatewayOrigin: h.origin)
                _ = try await before.signIn(from: "/x", as: sub)
                let eventTime = h.clock.now() / 1000 + 30  // the user revoked consent 30 s after that sign-in
                h.clock.advance(by: .seconds(60))
                let after = TestBrowser(gatewayOrigin: h.origin)
                _ = try await after.signIn(from: "/x", as: sub)  // … and consented again
                let url = h.origin + "/_auth/apple/notifications"
                #expect(await h.simulator.sendNotification(.consentRevoked, sub: sub, to: url, eventTime: eventTime, retryDelays: []).status == 200)
                await h.service.core.outbox.drain()
                #expect(try await after.request("/x").status == 200)
                #expect(receiver.received.isEmpty, "no user.revoked for a user who is signed in with a newer consent: \(receiver.received.map(\.type))")
            }
        }
    }

    @Test("a job queued by the previous version (a JWS signed then) is signed again at delivery: its own typ, an exp, today's key")
    func legacyPayloadSignedAgain() throws {
        let (then, today) = (try IdentityAssertionSigner(pem: P256.Signing.PrivateKey().pemRepresentation, issuer: "https://a.example", ttl: 60),
                             try IdentityAssertionSigner(pem: P256.Signing.PrivateKey().pemRepresentation, issuer: "https://a.example", ttl: 60))
        let queued = then.sign(["jti": "j-1", "type": "user.revoked", "sub": "001.a", "reason": "operator", "event_time": 5000, "iat": 5, "iss": "https://a.example"])
        let job = OutboxJob(id: "event-j-1", kind: .event, payload: "https://app.example/events user.revoked " + queued, nextAttempt: 0, created: 0)
        let sent = try #require(AppEvents.payload(of: job, signer: today, now: 1_000_000))
        #expect(sent.url == "https://app.example/events" && sent.type == "user.revoked")
        let parts = sent.jws.split(separator: ".").map(String.init)
        let header = try #require(Base64URLTest.decode(parts[0]))
        #expect(String(decoding: header, as: UTF8.self).contains(#""kid":"\#(today.keyID)""#) && String(decoding: header, as: UTF8.self).contains(#""typ":"sessiongate-event+jwt""#))
        let raw = try #require(Base64URLTest.decode(parts[2]))
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: raw)
        #expect(today.key.publicKey.isValidSignature(signature, for: Array("\(parts[0]).\(parts[1])".utf8)))
        let payload = try #require(Base64URLTest.decode(parts[1]))
        let claims = try #require(try JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any])
        #expect(claims["jti"] as? String == "j-1" && claims["aud"] as? String == "https://app.example/events")
        #expect(Self.number(claims["iat"]) == 1000 && Self.number(claims["exp"]) == 1300 && Self.number(claims["event_time"]) == 5000)
    }

    @Test("events need the assertion key; URLs are checked")
    func configuration() {
        var yaml = "events:\n  url: http://127.0.0.1:9000/events\nroutes:\n  - name: app\n    upstream: \"http://127.0.0.1:9000\"\n    auth: public\n"
        #expect(GatewayConfiguration.parse(yaml: yaml).errors.map(\.path) == ["events"])
        yaml = "identity:\n  assertion:\n    enabled: true\n    key_file: /k.pem\n" + yaml
        #expect(GatewayConfiguration.parse(yaml: yaml).errors.isEmpty)
        let bad = yaml.replacingOccurrences(of: "http://127.0.0.1:9000/events", with: "ftp://x")
        #expect(GatewayConfiguration.parse(yaml: bad).errors.map(\.path) == ["events.url"])
        let unknownKind = yaml.replacingOccurrences(of: "  url: http://127.0.0.1:9000/events\n", with: "  urls:\n    user.exploded: http://x/\n")
        #expect(GatewayConfiguration.parse(yaml: unknownKind).errors.map(\.path) == ["events.urls.user.exploded"])
        for (url, ok) in [("https://app.example.com/hooks/sg", true), ("http://[::1]:8080/", true), ("http://user:pw@x/", false), ("http:///x", false),
                          ("https://x/#frag", false), ("https://x y/", false)] {
            #expect(GatewayConfiguration.isWebURL(url) == ok, "\(url)")
        }
    }
}
