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
enum AppEventKind: String, Sendable, CaseIterable {
    /// The user's sessions were revoked (consent revoked at Apple, `invalid_grant`, an operator).
    case userRevoked = "user.revoked"
    /// The user deleted their account (Apple's `account-delete`, or `POST /_auth/revoke`): the
    /// gateway forgot them; the app must delete its data.
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
    /// Why (`account_deleted`, `consent_revoked`, `user`, `apple_invalid_grant`, `logout`, …).
    var reason: String
    var email: String? = nil
    var emailForwarding: String? = nil
    /// The first 12 hex digits of the session's store key (never the session id).
    var session: String? = nil
    /// `user.transferred`: the user's `sub` at the sending team, when this store knew it.
    var formerSub: String? = nil
    /// `user.transferred`: Apple's transfer id, the key the sending team's data export uses.
    var transferSubject: String? = nil
}

/// Signs each event with the identity-assertion key and queues it in the store's outbox, from
/// where it is POSTed to the app as `{"payload": "<JWS>"}` (the shape of Apple's own
/// notifications) until the app answers 2xx: at least once, by whichever instance claims it.
/// The app verifies the JWS with `/_auth/jwks.json` (`iss` = `server.public_url`, `aud` = the
/// URL it was sent to) and deduplicates by `jti`.
final class AppEvents: Sendable {
    let destinations: [AppEventKind: String]
    let signer: IdentityAssertionSigner
    let outbox: Outbox
    let now: @Sendable () -> Int64
    let logger: Logger

    init?(_ c: GatewayConfiguration.Events, signer: IdentityAssertionSigner?, outbox: Outbox, now: @escaping @Sendable () -> Int64, logger: Logger) {
        guard c.isEnabled, let signer else { return nil }
        var destinations: [AppEventKind: String] = [:]
        for kind in AppEventKind.allCases {
            if let url = c.urls[kind.rawValue] ?? c.url { destinations[kind] = url }
        }
        self.destinations = destinations
        self.signer = signer
        self.outbox = outbox
        self.now = now
        self.logger = logger
    }

    /// Queues `event` for the app (when a URL takes its kind) and tries it at once, in the
    /// background: the caller never waits for the app.
    func emit(_ event: AppEvent) {
        guard let url = destinations[event.kind] else { return }
        let t = now()
        let id = AuthEndpointGuard.randomToken()
        var claims: [String: Any] = ["iss": signer.issuer, "aud": url, "iat": t / 1000, "jti": id, "type": event.kind.rawValue, "sub": event.sub,
                                     "reason": event.reason, "event_time": t]
        if let v = event.email { claims["email"] = v }
        if let v = event.emailForwarding { claims["email_forwarding"] = v }
        if let v = event.session { claims["session"] = v }
        if let v = event.formerSub { claims["former_sub"] = v }
        if let v = event.transferSubject { claims["transfer_sub"] = v }
        let job = OutboxJob(id: "event-" + id, kind: .event, payload: url + " " + event.kind.rawValue + " " + signer.sign(claims), nextAttempt: t, created: t)
        outbox.enqueueInBackground(job) { error in
            self.logger.error("an event for the app could not be queued: it is lost", metadata: ["type": "\(event.kind.rawValue)", "error": "\(error)"])
        }
    }

    /// `user.transferred` for a user just mapped to their new `sub` (`reason`: `import` or `sign_in`).
    func transferred(_ user: TransferredUser, reason: String) {
        emit(AppEvent(kind: .userTransferred, sub: user.sub, reason: reason, formerSub: user.formerSub, transferSubject: user.transferSubject))
    }

    /// One delivery: 2xx is done; anything else (or no answer within `events.timeout`) is retried.
    static func deliver(_ job: OutboxJob, http: HTTPClient, timeout: TimeAmount, logger: Logger) async -> Outbox.Result {
        let parts = job.payload.split(separator: " ", maxSplits: 2)
        guard parts.count == 3 else { return .drop }
        var request = HTTPClientRequest(url: String(parts[0]))
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/json")
        request.headers.add(name: "user-agent", value: "sessiongate-events")
        request.headers.add(name: "x-sessiongate-event", value: String(parts[1]))
        request.body = .bytes(ByteBuffer(string: #"{"payload":""# + parts[2] + #""}"#))
        do {
            let response = try await http.execute(request, timeout: timeout)
            _ = try? await response.body.collect(upTo: 64 * 1024)
            if (200..<300).contains(response.status.code) { return .done }
            logger.warning("the app refused an event: retried later", metadata: ["type": "\(parts[1])", "status": "\(response.status.code)", "attempt": "\(job.attempts + 1)"])
        } catch {
            logger.warning("an event could not reach the app: retried later", metadata: ["type": "\(parts[1])", "error": "\(error)", "attempt": "\(job.attempts + 1)"])
        }
        return .retry
    }
}
