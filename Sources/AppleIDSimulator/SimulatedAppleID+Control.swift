import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// The simulator's control surface: a Swift API for tests, and the same under `/sim/` over
/// HTTP (JSON) for the demo, the bench and manual use.
extension SimulatedAppleID {
    /// Notification types Apple sends (apple-sign-in.md §8.2).
    public enum NotificationType: String, Sendable, CaseIterable {
        case emailDisabled = "email-disabled", emailEnabled = "email-enabled", consentRevoked = "consent-revoked", accountDelete = "account-delete"
    }

    public struct Delivery: Sendable, Equatable {
        public var jti: String
        public var attempts: Int
        /// The last HTTP status received (nil: no answer).
        public var status: Int?
        public var delivered: Bool { status == 200 }
    }

    func countGrant(_ grantType: String) { counters.withLockedValue { $0["/auth/token#\(grantType)", default: 0] += 1 } }

    /// How many `/auth/token` requests named this grant type.
    public func grantCount(_ grantType: String) -> Int { requestCount("/auth/token#\(grantType)") }

    /// The user deletes their Apple Account: every token dies, the `sub` is never valid again.
    public func deleteAccount(sub: String) {
        revokeConsent(sub: sub)
        grants.withLockedValue { $0.users[sub] = nil }
    }

    /// Signs a notification about `sub` and POSTs it to `url` as `{"payload": JWS}`, retrying
    /// on anything but 200 after each of `retryDelays` (Apple retries; its schedule is unknown).
    /// `jti`: reuse one to redeliver the same notification (deduplication tests).
    /// `eventTime`: when the event happened (seconds; default now): a late delivery.
    /// - Parameter audience: the primary App ID of the app group it concerns (default: the
    ///   team's first client without return URLs).
    public func sendNotification(_ type: NotificationType, sub: String, to url: String, jti: String? = nil, eventTime: Int64? = nil, audience: String? = nil,
                                 retryDelays: [TimeAmount] = [.seconds(1), .seconds(4), .seconds(16)]) async -> Delivery {
        let faults = self.faults.withLockedValue { $0 }
        let now = clock()
        let happened = eventTime ?? now
        let jti = jti ?? String(Grants.opaqueToken(prefix: "j").suffix(22))
        let user = grants.withLockedValue { $0.users[sub] }
        var events: [String: Any] = ["type": type == .accountDelete ? faults.accountDeleteType : type.rawValue, "sub": sub,
                                     "event_time": faults.eventTimeInMilliseconds ? happened * 1000 + 123 : happened]
        if type == .emailDisabled || type == .emailEnabled {
            // Forwarding is a relay address's: Apple has nothing to say of a shared one.
            guard user?.isPrivateEmail != false || faults.emailEventsForSharedEmail else { return Delivery(jti: jti, attempts: 0, status: nil) }
            events["email"] = user?.email ?? "unknown@privaterelay.appleid.com"
            events["is_private_email"] = faults.stringBooleans ? "true" : true
        }
        let eventsText = String(decoding: (try? JSONSerialization.data(withJSONObject: events, options: [.sortedKeys])) ?? Data(), as: UTF8.self)
        // Notifications name the primary App ID (observed): the first client without return URLs.
        let audience = audience ?? team.clients.filter { $0.value.isEmpty }.keys.sorted().first ?? team.clients.keys.sorted().first ?? ""
        var claims: [String: Any] = ["iss": "https://appleid.apple.com", "aud": audience, "iat": now, "jti": jti,
                                     "events": faults.eventsAsObject ? events : eventsText]
        if faults.notificationIncludesExp { claims["exp"] = now + 86_400 }
        guard let payload = try? signingKeys.sign(claims) else { return Delivery(jti: jti, attempts: 0, status: nil) }
        var attempts = 0
        var status: Int? = nil
        for delay in [TimeAmount.zero] + retryDelays {
            if delay > .zero { try? await Task.sleep(nanoseconds: UInt64(delay.nanoseconds)) }
            attempts += 1
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "content-type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: #"{"payload":"\#(payload)"}"#))
            status = try? await Int(notifier.execute(request, timeout: .seconds(5)).status.code)
            counters.withLockedValue { $0["notifications#attempts", default: 0] += 1 }
            if status == 200 { break }
        }
        return Delivery(jti: jti, attempts: attempts, status: status)
    }

    /// What AuthenticationServices hands a native app after the user consents: an identity
    /// token and an authorization code for the app's own client id (an App ID), no redirect.
    /// `scopes`: what the app requests (granted at the user's first authorization of the group).
    public func nativeAuthorization(sub: String, clientID: String, nonce: String?, scopes: [String] = ["name", "email"]) throws -> (identityToken: String, authorizationCode: String) {
        let first = grants.withLockedValue { g -> Bool in
            guard let user = g.users[sub], !user.authorized else { return false }
            g.users[sub]?.authorized = true
            g.users[sub]?.grantedScopes = Set(scopes)
            return true
        }
        let token = try identityToken(sub: sub, clientID: clientID, nonce: nonce, now: clock(), faults: faults.withLockedValue { $0 }, firstAuthorization: first)
        return (token, issueCode(sub: sub, clientID: clientID, redirectURI: nil, nonce: nonce, firstAuthorization: first))
    }

    // MARK: HTTP

    func controlEndpoint(_ request: SimulatorRequest, path: String) -> SimulatorResponse {
        let body = (try? JSONSerialization.jsonObject(with: Data(request.body.readableBytesView))) as? [String: Any] ?? [:]
        let parts = path.split(separator: "/").map(String.init)  // ["sim", ...]
        let route = Array(parts.dropFirst())
        let method = request.head.method
        let userAction = route.count == 3 && route[0] == "users" && method == .POST ? (sub: route[1], action: route[2]) : nil
        if method == .POST, route == ["users"] {
            let sub = createUser(
                email: body["email"] as? String, privateEmail: body["private_email"] as? Bool ?? true,
                realUserStatus: (body["real_user_status"] as? NSNumber)?.intValue ?? 2,
                firstName: body["first_name"] as? String ?? "Jane", lastName: body["last_name"] as? String ?? "Appleseed")
            return Self.json(["sub": sub])
        }
        if method == .GET, route == ["users"] {
            let users = grants.withLockedValue { $0.users.values.sorted { $0.sub < $1.sub } }
            return Self.json(["users": users.map { ["sub": $0.sub, "email": $0.email, "first_name": $0.firstName, "last_name": $0.lastName] }])
        }
        // What a user does in Settings: Apple then tells the relying party (its notification URL).
        if let userAction, userAction.action == "revoke-consent" {
            revokeConsent(sub: userAction.sub)
            if let url = notificationURL { Task { _ = await self.sendNotification(.consentRevoked, sub: userAction.sub, to: url) } }
            return Self.json(["ok": true, "notified": notificationURL != nil])
        }
        if let userAction, userAction.action == "delete-account" {
            deleteAccount(sub: userAction.sub)
            if let url = notificationURL { Task { _ = await self.sendNotification(.accountDelete, sub: userAction.sub, to: url) } }
            return Self.json(["ok": true, "notified": notificationURL != nil])
        }
        if method == .POST, route == ["native"] {
            guard let sub = body["sub"] as? String, let clientID = body["client_id"] as? String, team.clients[clientID] != nil,
                  let credential = try? nativeAuthorization(sub: sub, clientID: clientID, nonce: body["nonce"] as? String) else {
                return Self.error(.badRequest, "invalid_request", "sub (a known user) and client_id (a registered client) are required; nonce is optional")
            }
            return Self.json(["identity_token": credential.identityToken, "authorization_code": credential.authorizationCode])
        }
        if method == .POST, route == ["keys", "rotate"] {
            return (try? rotateKeys()).map { Self.json(["kid": $0]) } ?? Self.error(.internalServerError, "server_error")
        }
        if method == .GET, route == ["counters"] {
            return Self.json(counters.withLockedValue { $0 })
        }
        if method == .POST, route == ["faults"] {
            setFaults { f in
                if let v = body["latency_ms"] as? NSNumber { f.latencyMilliseconds = v.int64Value }
                if let v = body["token_failure_status"] as? NSNumber { f.tokenFailureStatus = v.intValue == 0 ? nil : v.intValue }
                if let v = body["throttle_interval"] as? NSNumber { f.throttleInterval = v.int64Value }
                if let v = body["revoke_failure_status"] as? NSNumber { f.revokeFailureStatus = v.intValue == 0 ? nil : v.intValue }
                if let v = body["keys_failure_status"] as? NSNumber { f.keysFailureStatus = v.intValue == 0 ? nil : v.intValue }
                if let v = body["reject_client_secrets"] as? Bool { f.rejectClientSecrets = v }
                if let v = body["retry_after"] as? NSNumber { f.retryAfter = v.intValue == 0 ? nil : v.intValue }
                if let v = body["refresh_returns_id_token"] as? Bool { f.refreshReturnsIDToken = v }
                if let v = body["string_booleans"] as? Bool { f.stringBooleans = v }
                if let v = body["states_shared_email"] as? Bool { f.statesSharedEmail = v }
                if let v = body["event_time_ms"] as? Bool { f.eventTimeInMilliseconds = v }
                if let v = body["account_delete_type"] as? String { f.accountDeleteType = v }
                if let v = body["auto_consent"] as? String { f.autoConsent = v }
                if body["auto_consent"] is NSNull { f.autoConsent = nil }
            }
            return Self.json(["ok": true])
        }
        if method == .POST, route == ["notify"] {
            guard let sub = body["sub"] as? String, let type = (body["type"] as? String).flatMap(NotificationType.init(rawValue:)),
                  let url = (body["url"] as? String) ?? notificationURL else {
                return Self.error(.badRequest, "invalid_request", "sub, type (email-disabled | email-enabled | consent-revoked | account-delete) and url are required")
            }
            let jti = String(Grants.opaqueToken(prefix: "j").suffix(22))
            Task { _ = await self.sendNotification(type, sub: sub, to: url, jti: jti) }
            var response = Self.json(["jti": jti, "queued": true])
            response.status = .accepted
            return response
        }
        return Self.error(.notFound, "not_found")
    }
}
