import AsyncHTTPClient
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import AppleID
@testable import AppleIDSimulator

/// A receiver for notifications: records bodies, answers scripted statuses.
final class NotificationReceiver: Sendable {
    let server: SimulatorHTTPServer
    let bodies = NIOLockedValueBox<[[UInt8]]>([])
    let statuses: NIOLockedValueBox<[HTTPResponseStatus]>

    let waiters = NIOLockedValueBox<[CheckedContinuation<Void, Never>]>([])

    init(statuses: [HTTPResponseStatus]) async throws {
        let bodies = self.bodies
        let script = NIOLockedValueBox(statuses)
        let waiters = self.waiters
        self.statuses = script
        server = try await SimulatorHTTPServer.start(host: "127.0.0.1", port: 0, group: MultiThreadedEventLoopGroup.singleton) { request in
            bodies.withLockedValue { $0.append(Array(request.body.readableBytesView)) }
            waiters.withLockedValue { list in list.forEach { $0.resume() }; list.removeAll() }
            let status = script.withLockedValue { $0.isEmpty ? .ok : $0.removeFirst() }
            return SimulatorResponse(status: status, "")
        }
    }

    var url: String { "http://127.0.0.1:\(server.localAddress!.port!)/_auth/apple/notifications" }

    /// Suspends until at least `count` bodies have arrived.
    func waitForBodies(_ count: Int) async {
        while bodies.withLockedValue({ $0.count }) < count {
            await withCheckedContinuation { continuation in
                let ready = waiters.withLockedValue { list -> Bool in
                    if bodies.withLockedValue({ $0.count }) >= count { return true }
                    list.append(continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        }
    }
}

@Suite("Simulator notifications and control API (real HTTP)", .serialized, .timeLimit(.minutes(1)))
struct SimulatorControlTests {
    static let fast: [TimeAmount] = [.milliseconds(10), .milliseconds(10), .milliseconds(10)]

    @Test("a notification is retried until answered 200, and verifies as Apple's would")
    func retries() async throws {
        try await TokenFixture.with { f in
            let receiver = try await NotificationReceiver(statuses: [.internalServerError, .serviceUnavailable])
            let sub = f.simulator.createUser()
            let delivery = await f.simulator.sendNotification(.consentRevoked, sub: sub, to: receiver.url, retryDelays: Self.fast)
            #expect(delivery.attempts == 3)
            #expect(delivery.delivered)
            let clock = f.clock
            let verifier = NotificationVerifier(keySet: f.keySet, clientIDs: [TokenFixture.web, TokenFixture.app], now: { clock.now })
            let body = try #require(receiver.bodies.withLockedValue { $0.last })
            let notification = try await verifier.verify(body: body)
            #expect(notification.kind == .consentRevoked)
            #expect(notification.subject == sub)
            #expect(notification.jti == delivery.jti)
            #expect(notification.audience == TokenFixture.app, "notifications name the App ID")
            #expect(notification.eventTime == clock.now, "milliseconds normalized")
            await receiver.server.close()
        }
    }

    @Test("an unanswered notification gives up after the retries")
    func givesUp() async throws {
        try await TokenFixture.with { f in
            let receiver = try await NotificationReceiver(statuses: Array(repeating: .badGateway, count: 10))
            let delivery = await f.simulator.sendNotification(.emailDisabled, sub: f.simulator.createUser(), to: receiver.url, retryDelays: Self.fast)
            #expect(delivery.attempts == 4)
            #expect(delivery.status == 502)
            await receiver.server.close()
        }
    }

    @Test("email events only for a Hide My Email relay user, as Apple: none for a shared email unless a test asks for it")
    func emailEventsOnlyForRelayUsers() async throws {
        try await TokenFixture.with { f in
            let receiver = try await NotificationReceiver(statuses: [])
            let shared = f.simulator.createUser(privateEmail: false)
            let none = await f.simulator.sendNotification(.emailDisabled, sub: shared, to: receiver.url, retryDelays: [])
            #expect(none.attempts == 0 && none.status == nil, "Apple has no forwarding to speak of for a shared email")
            #expect(await f.simulator.sendNotification(.emailDisabled, sub: f.simulator.createUser(), to: receiver.url, retryDelays: []).status == 200)
            f.simulator.setFaults { $0.emailEventsForSharedEmail = true }
            #expect(await f.simulator.sendNotification(.emailEnabled, sub: shared, to: receiver.url, retryDelays: []).status == 200, "the lenient switch")
            await receiver.server.close()
        }
    }

    @Test("redelivery keeps the jti; account-deleted spelling and seconds are available as faults")
    func variants() async throws {
        try await TokenFixture.with { f in
            let receiver = try await NotificationReceiver(statuses: [])
            let sub = f.simulator.createUser()
            f.simulator.setFaults { $0.accountDeleteType = "account-deleted"; $0.eventTimeInMilliseconds = false; $0.stringBooleans = false }
            let first = await f.simulator.sendNotification(.accountDelete, sub: sub, to: receiver.url, retryDelays: [])
            let again = await f.simulator.sendNotification(.accountDelete, sub: sub, to: receiver.url, jti: first.jti, retryDelays: [])
            let clock = f.clock
            let verifier = NotificationVerifier(keySet: f.keySet, clientIDs: [TokenFixture.app], now: { clock.now })
            let bodies = receiver.bodies.withLockedValue { $0 }
            #expect(bodies.count == 2)
            let a = try await verifier.verify(body: bodies[0]), b = try await verifier.verify(body: bodies[1])
            #expect(a.jti == b.jti)
            #expect(a.kind == .accountDeleted)
            #expect(a.eventTime == clock.now)
            #expect(String(decoding: bodies[0], as: UTF8.self).contains("payload"))
            #expect(again.delivered)
            await receiver.server.close()
        }
    }

    @Test("§12 producers: events as an object, no exp, expires_in 300, consent-revoked after /auth/revoke")
    func producers() async throws {
        let receiver = try await NotificationReceiver(statuses: [])
        let team = TeamFixture()
        let clock = team.clock
        let simulator = try await SimulatedAppleID.start(
            team: .init(teamID: team.teamID, keys: [team.keyID: team.key.publicKey], clients: [TokenFixture.web: [TokenFixture.returnURL], TokenFixture.app: []]),
            clock: { clock.now }, notificationURL: receiver.url)
        let client = HTTPClient(eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup.singleton))
        let keySet = AppleKeySet(baseURL: simulator.baseURL, httpClient: client, logger: Logger(label: "t"))
        let verifier = NotificationVerifier(keySet: keySet, clientIDs: [TokenFixture.app], now: { clock.now })
        let tokens = AppleTokenClient(baseURL: simulator.baseURL, httpClient: client, secrets: try team.minter(), logger: Logger(label: "t"))

        simulator.setFaults { $0.eventsAsObject = true; $0.notificationIncludesExp = false; $0.accessTokenLifetime = 300; $0.notifyOnRevoke = true }
        let sub = simulator.createUser()
        _ = await simulator.sendNotification(.emailEnabled, sub: sub, to: receiver.url, retryDelays: [])
        let first = try await verifier.verify(body: try #require(receiver.bodies.withLockedValue { $0.first }))
        #expect(first.kind == .emailEnabled)
        #expect(!String(decoding: receiver.bodies.withLockedValue { $0[0] }, as: UTF8.self).isEmpty)

        let code = simulator.issueCode(sub: sub, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL, nonce: nil)
        guard case .success(let issued) = await tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL) else { Issue.record("exchange"); return }
        #expect(issued.expiresIn == 300)
        #expect(await tokens.revoke(token: try #require(issued.refreshToken), isRefreshToken: true, clientID: TokenFixture.web) == .revoked)
        await receiver.waitForBodies(2)
        let second = try await verifier.verify(body: receiver.bodies.withLockedValue { $0[1] })
        #expect(second.kind == .consentRevoked)
        #expect(second.subject == sub)

        try await client.shutdown()
        await simulator.stop()
        await receiver.server.close()
    }

    @Test("control API over HTTP: users, faults, counters, account deletion, key rotation")
    func controlAPI() async throws {
        try await TokenFixture.with { f in
            func call(_ method: HTTPMethod, _ path: String, _ json: String = "{}") async throws -> [String: Any] {
                var request = HTTPClientRequest(url: f.simulator.baseURL + path)
                request.method = method
                if method == .POST { request.body = .bytes(ByteBuffer(string: json)) }
                let response = try await f.client.execute(request, timeout: .seconds(5))
                let body = try await response.body.collect(upTo: 1 << 20)
                return (try JSONSerialization.jsonObject(with: Data(body.readableBytesView))) as? [String: Any] ?? [:]
            }
            let sub = try #require(try await call(.POST, "/sim/users", #"{"email":"x@example.org","private_email":false}"#)["sub"] as? String)
            let code = f.simulator.issueCode(sub: sub, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL, nonce: nil)
            guard case .success(let tokens) = await f.tokens.exchange(code: code, clientID: TokenFixture.web, redirectURI: TokenFixture.returnURL),
                  let refresh = tokens.refreshToken else { Issue.record("exchange"); return }

            _ = try await call(.POST, "/sim/faults", #"{"token_failure_status":503}"#)
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .transient(reason: "token: status 503"))
            _ = try await call(.POST, "/sim/faults", #"{"token_failure_status":0,"latency_ms":2000}"#)
            let impatient = AppleTokenClient(baseURL: f.simulator.baseURL, httpClient: f.client, secrets: try f.team.minter(), timeout: .milliseconds(200), logger: Logger(label: "t"))
            let slow = await impatient.refresh(token: refresh, clientID: TokenFixture.web)
            guard case .transient = slow else { Issue.record("a slow Apple must be transient, got \(slow)"); return }
            _ = try await call(.POST, "/sim/faults", #"{"latency_ms":0}"#)

            let counters = try await call(.GET, "/sim/counters")
            #expect((counters["/auth/token#refresh_token"] as? NSNumber)?.intValue == 2)
            #expect((counters["/auth/token#authorization_code"] as? NSNumber)?.intValue == 1)

            _ = try await call(.POST, "/sim/users/\(sub)/delete-account")
            #expect(await f.tokens.refresh(token: refresh, clientID: TokenFixture.web) == .grantRevoked(error: "invalid_grant"))

            let receiver = try await NotificationReceiver(statuses: [])
            let other = f.simulator.createUser()
            let queued = try await call(.POST, "/sim/notify", #"{"sub":"\#(other)","type":"email-disabled","url":"\#(receiver.url)"}"#)
            let jti = try #require(queued["jti"] as? String)
            await receiver.waitForBodies(1)
            let clock = f.clock
            let notification = try await NotificationVerifier(keySet: f.keySet, clientIDs: [TokenFixture.app], now: { clock.now })
                .verify(body: receiver.bodies.withLockedValue { $0[0] })
            #expect(notification.jti == jti)
            #expect(notification.kind == .emailDisabled)
            #expect(try await call(.POST, "/sim/notify", #"{"sub":"x","type":"nonsense","url":"http://127.0.0.1:1"}"#)["error"] as? String == "invalid_request")
            await receiver.server.close()

            let kid = try #require(try await call(.POST, "/sim/keys/rotate")["kid"] as? String)
            #expect(f.simulator.publishedKeyIDs.last == kid)
            #expect(try await call(.GET, "/sim/nothing")["error"] as? String == "not_found")
        }
    }
}
