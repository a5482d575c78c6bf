import AppleID
import AsyncHTTPClient
import Foundation
import GatewayConfig
import HTTPProxy
import Logging
import NIOCore
import NIOHTTP1
import Sessions

/// What the app behind the gateway is told (`events.url`): the gateway is the only component
/// Apple notifies, and the app must act too (delete its own data for a deleted account).
enum AppEventKind: String, Sendable, CaseIterable, Codable {
    /// The user's sessions were revoked (consent revoked at Apple, the user's disconnect,
    /// `invalid_grant`, an operator): they must sign in again; the account stays (linked).
    case userRevoked = "user.revoked"
    /// The user's Apple account was deleted (Apple's `account-delete`), or an operator forgot
    /// them (`sessions revoke --forget`): the gateway forgot them; the app must delete its data.
    case userDeleted = "user.deleted"
    /// Apple's private relay for the user's email was turned on or off.
    case emailChanged = "user.email_changed"
    /// One session ended (logout, or replaced by a new sign-in).
    case sessionEnded = "session.ended"
    /// An app transfer gave the user a new `sub` and the gateway mapped them (`migrate import`,
    /// or their first sign-in at the recipient): the app re-keys its rows.
    case userTransferred = "user.transferred"
}

/// One event, before it is signed.
struct AppEvent: Sendable {
    var kind: AppEventKind
    var sub: String
    /// Why (`account_deleted`, `consent_revoked`, `disconnect`, `apple_invalid_grant`, `logout`, …).
    var reason: String
    /// When it happened (Unix ms): Apple's `event_time` for what Apple notified; nil: when the
    /// gateway acted (an `invalid_grant`: when Apple refused).
    var happenedAt: Int64? = nil
    var email: String? = nil
    var emailForwarding: String? = nil
    /// The first 12 hex digits of the session's store key (never the session id).
    var session: String? = nil
    /// `user.transferred`: the user's `sub` at the sending team, when this store knew it.
    var formerSub: String? = nil
    /// `user.transferred`: Apple's transfer id, the key the sending team's data export uses.
    var transferSubject: String? = nil
}

/// Queues each event in the store's outbox, from where it is POSTed to the app as
/// `{"payload": "<JWS>"}` (the shape of Apple's own notifications) until the app answers 2xx:
/// at least once, by whichever instance claims it. Each delivery is signed when it is sent, with
/// the identity-assertion key that instance holds (an event queued before a key rotation
/// verifies with the new key set), as `typ` `sessiongate-event+jwt` (never mistaken for an
/// identity assertion), valid `AppEvents.lifetime` from `iat`. A redelivery carries the same
/// `jti`; the app verifies the JWS with `/_auth/jwks.json` (`iss` = `server.public_url`, `aud`
/// = the URL it was sent to, `exp`), remembers each `jti` until its `exp`, and applies an event
/// only when its `event_time` is newer than what it last applied for that user.
final class AppEvents: Sendable {
    /// How long a delivered event is valid (seconds): a receiver rejects it after `exp`, so it
    /// remembers `jti`s that long and no longer.
    static let lifetime: Int64 = 300
    /// The JWS `typ` of events (identity assertions are `JWT`).
    static let type = "sessiongate-event+jwt"

    let destinations: [AppEventKind: String]
    let outbox: Outbox
    let now: @Sendable () -> Int64
    let logger: Logger

    init?(_ c: GatewayConfiguration.Events, signer: IdentityAssertionSigner?, outbox: Outbox, now: @escaping @Sendable () -> Int64, logger: Logger) {
        guard c.isEnabled, signer != nil else { return nil }
        var destinations: [AppEventKind: String] = [:]
        for kind in AppEventKind.allCases {
            if let url = c.urls[kind.rawValue] ?? c.url { destinations[kind] = url }
        }
        self.destinations = destinations
        self.outbox = outbox
        self.now = now
        self.logger = logger
    }

    /// Queues `event` for the app (when a URL takes its kind) and tries it at once, in the
    /// background: the caller never waits for the app. The claims are stored unsigned; each
    /// delivery signs them.
    func emit(_ event: AppEvent) {
        guard let url = destinations[event.kind] else { return }
        let t = now()
        let id = AuthEndpointGuard.randomToken()
        var claims: [String: Any] = ["jti": id, "type": event.kind.rawValue, "sub": event.sub, "reason": event.reason,
                                     "event_time": min(event.happenedAt ?? t, t), "processed_at": t]
        if let v = event.email { claims["email"] = v }
        if let v = event.emailForwarding { claims["email_forwarding"] = v }
        if let v = event.session { claims["session"] = v }
        if let v = event.formerSub { claims["former_sub"] = v }
        if let v = event.transferSubject { claims["transfer_sub"] = v }
        let json = (try? JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        let job = OutboxJob(id: "event-" + id, kind: .event, payload: url + " " + event.kind.rawValue + " " + json, nextAttempt: t, created: t)
        outbox.enqueueInBackground(job) { error in
            self.logger.error("an event for the app could not be queued: it is lost", metadata: ["type": "\(event.kind.rawValue)", "error": "\(error)"])
        }
    }

    /// `user.transferred` for a user just mapped to their new `sub` (`reason`: `import` or `sign_in`).
    func transferred(_ user: TransferredUser, reason: String) {
        emit(AppEvent(kind: .userTransferred, sub: user.sub, reason: reason, formerSub: user.formerSub, transferSubject: user.transferSubject))
    }

    /// The JWS one delivery of `job` sends, signed now by `signer`; nil for a payload that is
    /// not an event. A job queued by an earlier version holds a JWS signed then: its claims are
    /// signed again like any other (its own `typ`, an `exp`, the key of today).
    static func payload(of job: OutboxJob, signer: IdentityAssertionSigner, now t: Int64) -> (url: String, type: String, jws: String)? {
        let parts = job.payload.split(separator: " ", maxSplits: 2)
        guard parts.count == 3 else { return nil }
        let (url, type, body) = (String(parts[0]), String(parts[1]), parts[2])
        let stored = body.hasPrefix("{") ? (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any]
                                         : Base64URL.unverifiedClaims(ofJWS: body)  // queued signed, by an earlier version
        guard var claims = stored else { return nil }
        claims["iss"] = signer.issuer
        claims["aud"] = url
        claims["iat"] = t / 1000
        claims["exp"] = t / 1000 + lifetime
        return (url, type, signer.sign(claims, type: Self.type))
    }

    /// One delivery: 2xx is done; anything else (or no answer within `events.timeout`) is retried.
    /// Traced (`tracer`), each attempt is the root span of a trace of its own, which the app
    /// receives in `traceparent`.
    static func deliver(_ job: OutboxJob, signer: IdentityAssertionSigner, now: Int64, http: HTTPClient, timeout: TimeAmount, tracer: GatewayTracer?,
                        logger: Logger) async -> Outbox.Result {
        guard let (url, type, jws) = payload(of: job, signer: signer, now: now) else { return .drop }
        return await TraceScope.root(tracer, "event.deliver", kind: .client,
                                     [("sessiongate.event.type", .string(type)), ("sessiongate.event.attempt", .int(Int64(job.attempts + 1)))]) {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "content-type", value: "application/json")
            request.headers.add(name: "user-agent", value: "sessiongate-events")
            request.headers.add(name: "x-sessiongate-event", value: type)
            if let context = TraceScope.current?.context { request.headers.add(name: "traceparent", value: context.traceparent) }
            request.body = .bytes(ByteBuffer(string: #"{"payload":""# + jws + #""}"#))
            do {
                let response = try await http.execute(request, timeout: timeout)
                _ = try? await response.body.collect(upTo: 64 * 1024)
                if (200..<300).contains(response.status.code) { return (.done, nil) }
                logger.warning("the app refused an event: retried later", metadata: ["type": "\(type)", "status": .stringConvertible(response.status.code), "attempt": .stringConvertible(job.attempts + 1)])
            } catch {
                logger.warning("an event could not reach the app: retried later", metadata: ["type": "\(type)", "error": "\(error)", "attempt": .stringConvertible(job.attempts + 1)])
            }
            return (.retry, "not delivered: retried later")
        }
    }
}
