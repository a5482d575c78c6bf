import Foundation

/// One verified server-to-server notification (apple-sign-in.md §8).
public struct AppleNotification: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        case emailDisabled, emailEnabled, consentRevoked
        /// `account-delete` (older docs, live traffic) or `account-deleted` (current docs).
        case accountDeleted
        /// Any other type: answer 200 and ignore.
        case unknown(String)
    }

    /// Unique per notification: deduplicate on it (Apple redelivers).
    public var jti: String?
    public var audience: String
    public var kind: Kind
    public var subject: String
    public var email: String?
    public var isPrivateEmail: Bool?
    /// Seconds since 1970 (Apple sends seconds or milliseconds; normalized here).
    public var eventTime: Int64?
}

/// Verifies the body Apple posts (`{"payload": "<JWS>"}`): the same signature and claim checks
/// as identity tokens (`exp` only when present), then the `events` claim — a JSON string as
/// Apple sends it, or an object as Apple documents it.
public struct NotificationVerifier: Sendable {
    private let core: AppleJWSVerifier
    private let now: @Sendable () -> Int64
    /// Bound on the request body.
    public static let maximumBodyBytes = 64 * 1024
    /// A notification issued longer ago than this is refused (400), with or without `exp`: Apple
    /// sets `exp` = `iat` + 24 h in live traffic, and the `jti` is remembered for 7 days, so a
    /// captured notification can never be replayed once deduplication has forgotten it.
    public static let maximumAge: Int64 = 86_400

    public init(keySet: AppleKeySet, clientIDs: [String], leeway: Int64 = 5, now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }) {
        core = AppleJWSVerifier(keySet: keySet, clientIDs: clientIDs, leeway: leeway, now: now)
        self.now = now
    }

    public func verify(body: [UInt8]) async throws(AppleTokenRejection) -> AppleNotification {
        guard body.count <= Self.maximumBodyBytes,
              let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any],
              let payload = object["payload"] as? String else { throw .malformed }
        let verified = try await core.verify(payload, requireExpiry: false)
        // `iat` is present: the core requires it.
        if let iat = AppleJWSVerifier.seconds(verified.claims["iat"]), now() - iat > Self.maximumAge + core.leeway { throw .stale }
        let events: [String: Any]
        if let text = verified.claims["events"] as? String {
            guard let parsed = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] else { throw .events }
            events = parsed
        } else if let object = verified.claims["events"] as? [String: Any] {
            events = object
        } else {
            throw .events
        }
        guard let type = events["type"] as? String, let subject = events["sub"] as? String, !subject.isEmpty else { throw .events }
        let kind: AppleNotification.Kind
        switch type {
        case "email-disabled": kind = .emailDisabled
        case "email-enabled": kind = .emailEnabled
        case "consent-revoked": kind = .consentRevoked
        case "account-delete", "account-deleted": kind = .accountDeleted
        default: kind = .unknown(type)
        }
        // A value above 10^12 can only be milliseconds (§8.2).
        let eventTime = AppleJWSVerifier.seconds(events["event_time"]).map { $0 > 1_000_000_000_000 ? $0 / 1000 : $0 }
        return AppleNotification(
            jti: verified.claims["jti"] as? String, audience: verified.audience, kind: kind, subject: subject,
            email: events["email"] as? String,
            isPrivateEmail: try AppleJWSVerifier.privateEmail(events["is_private_email"], email: events["email"] as? String),
            eventTime: eventTime)
    }
}
