import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// Apple's answer to a token request, classified once (STYLE: typed errors, classified where
/// the failure is understood; never branch on error text).
public enum AppleTokenOutcome: Sendable, Equatable {
    case success(AppleTokens)
    /// The grant is dead: `invalid_grant`, or `invalid_request` on an otherwise well-formed
    /// refresh (the user revoked the app). End the session.
    case grantRevoked(error: String)
    /// Our configuration is wrong: `invalid_client`, `unauthorized_client`,
    /// `unsupported_grant_type`, `invalid_scope`, or `invalid_request` on a code exchange.
    /// Alert; never log a user out for it.
    case clientMisconfigured(error: String)
    /// Apple is unavailable or answered nonsense: 5xx, timeout, connection error, a body that
    /// is not the documented JSON. Keep sessions; retry later, and not before `retryAfter`
    /// seconds when Apple said so (`Retry-After` on a 503).
    case transient(reason: String, retryAfter: Int? = nil)
    /// Apple throttles our client (429): every call of the client fares the same, so the whole
    /// fleet backs off (not each token on its own), and not before `retryAfter` seconds when
    /// Apple said so. Keep sessions.
    case throttled(retryAfter: Int?)
}

extension AppleTokenOutcome {
    /// A refresh's outcome, judged by whether this client's refresh requests are proven well
    /// formed (Apple answered one of them with a success or `invalid_grant` since this process
    /// started). `invalid_request` means the user revoked the app only for a well-formed
    /// request (apple-sign-in.md §3.5); before the proof it may be our own malformed request —
    /// revoking on it could sign out every user — so it is our client's fault until a request
    /// of the client is answered otherwise.
    public func judged(clientProven: Bool) -> AppleTokenOutcome {
        guard case .grantRevoked("invalid_request") = self, !clientProven else { return self }
        return .clientMisconfigured(error: "invalid_request before any refresh of this client was answered otherwise")
    }

    /// Proves the client's refresh requests well formed (`judged`).
    public var provesRequests: Bool {
        switch self {
        case .success: true
        case .grantRevoked(let error): error == "invalid_grant"
        case .clientMisconfigured, .transient, .throttled: false
        }
    }
}

public struct AppleTokens: Sendable, Equatable {
    public var accessToken: String
    /// Present on a code exchange; a refresh answers without one (the old one stays valid).
    public var refreshToken: String?
    /// Optional on refresh: Apple has answered both ways (apple-sign-in.md §3.3).
    public var idToken: String?
    public var expiresIn: Int?
}

/// Apple's revoke answer.
public enum AppleRevokeOutcome: Sendable, Equatable {
    case revoked
    /// Apple refused this token for good: `invalid_grant` (issued to another client, TN3107) or
    /// `invalid_request` for a well-formed request. Asking again cannot help.
    case refused(error: String)
    /// `invalid_client`/`unauthorized_client`: our credentials (a key being rotated, a Services
    /// ID not yet set up); transient once they are mended.
    case clientMisconfigured(error: String)
    case transient(reason: String)
}

/// What `/auth/usermigrationinfo` answered (apple-sign-in.md §9.2).
public enum AppleMigrationOutcome: Sendable, Equatable {
    /// The sending team's answer: the user's transfer id for the target team.
    case transferSubject(String)
    /// The recipient's answer: the user's `sub` here, and the new relay address for relay users.
    case subject(sub: String, email: String?, privateEmail: Bool)
    /// `invalid_request` for this user: unknown, consent revoked, or outside the transfer period.
    case refused(reason: String)
    /// Our credentials were refused (`invalid_client`): no other user will fare better.
    case clientMisconfigured(error: String)
    case transient(reason: String, retryAfter: Int? = nil)
}

/// The relying party's client of `/auth/token` and `/auth/revoke`: form-encoded,
/// `client_secret_post`, a User-Agent and a timeout, on the gateway's event loops.
public struct AppleTokenClient: Sendable {
    private let baseURL: String
    private let httpClient: HTTPClient
    private let secrets: ClientSecretMinter
    private let timeout: TimeAmount
    private let logger: Logger

    /// Fields every call made in this task carries besides its own: the caller's W3C trace
    /// context (`traceparent`, `tracestate`), set around a call.
    @TaskLocal public static var traceFields: [(String, String)] = []

    public init(baseURL: String, httpClient: HTTPClient, secrets: ClientSecretMinter, timeout: TimeAmount = .seconds(5), logger: Logger) {
        self.baseURL = baseURL
        self.httpClient = httpClient
        self.secrets = secrets
        self.timeout = timeout
        self.logger = logger
    }

    /// Exchanges an authorization code. `redirectURI`: the web flow's return URL; nil for a
    /// native app's code (it had none).
    public func exchange(code: String, clientID: String, redirectURI: String?) async -> AppleTokenOutcome {
        var fields = [("client_id", clientID), ("client_secret", secrets.secret(for: clientID)), ("grant_type", "authorization_code"), ("code", code)]
        if let redirectURI { fields.append(("redirect_uri", redirectURI)) }
        return await token(fields, isRefresh: false)
    }

    /// Validates a refresh token (at most once a day per token: the caller's policy).
    public func refresh(token refreshToken: String, clientID: String) async -> AppleTokenOutcome {
        await token([("client_id", clientID), ("client_secret", secrets.secret(for: clientID)),
                     ("grant_type", "refresh_token"), ("refresh_token", refreshToken)], isRefresh: true)
    }

    /// Revokes a refresh or access token (Apple answers 200 even for unknown tokens).
    public func revoke(token: String, isRefreshToken: Bool, clientID: String) async -> AppleRevokeOutcome {
        let fields = [("client_id", clientID), ("client_secret", secrets.secret(for: clientID)), ("token", token),
                      ("token_type_hint", isRefreshToken ? "refresh_token" : "access_token")]
        switch await post("/auth/revoke", fields) {
        case .failure(let failure): return .transient(reason: failure.reason)
        case .success(let (status, body, _)):
            if status == 200 { return .revoked }
            if status == 400, let error = Self.errorCode(body) {
                switch error {
                case "invalid_grant", "invalid_request": return .refused(error: error)
                case "invalid_client", "unauthorized_client": return .clientMisconfigured(error: error)
                default: return .transient(reason: "revoke: \(error)")
                }
            }
            return .transient(reason: "revoke: status \(status)")
        }
    }

    /// An access token for `/auth/usermigrationinfo` (`client_credentials`, scope `user.migration`).
    public func migrationAccessToken(clientID: String) async -> AppleTokenOutcome {
        await token([("client_id", clientID), ("client_secret", secrets.secret(for: clientID)),
                     ("grant_type", "client_credentials"), ("scope", "user.migration")], isRefresh: false)
    }

    /// The sending team: `sub`'s transfer id for team `target`.
    public func transferSubject(of sub: String, target: String, clientID: String, accessToken: String) async -> AppleMigrationOutcome {
        await migration([("sub", sub), ("target", target), ("client_id", clientID), ("client_secret", secrets.secret(for: clientID))], accessToken: accessToken)
    }

    /// The recipient team: the `sub` (and relay address) a transfer id stands for here.
    public func exchange(transferSubject: String, clientID: String, accessToken: String) async -> AppleMigrationOutcome {
        await migration([("transfer_sub", transferSubject), ("client_id", clientID), ("client_secret", secrets.secret(for: clientID))], accessToken: accessToken)
    }

    private func migration(_ fields: [(String, String)], accessToken: String) async -> AppleMigrationOutcome {
        switch await post("/auth/usermigrationinfo", fields, headers: [("authorization", "Bearer \(accessToken)")]) {
        case .failure(let failure): return .transient(reason: failure.reason)
        case .success(let (status, body, retryAfter)): return Self.classifyMigration(status: status, body: body, retryAfter: retryAfter)
        }
    }

    static func classifyMigration(status: Int, body: [UInt8], retryAfter: String? = nil) -> AppleMigrationOutcome {
        if status == 200 {
            guard let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any] else {
                return .transient(reason: "usermigrationinfo: 200 without JSON")
            }
            if let id = object["transfer_sub"] as? String, !id.isEmpty { return .transferSubject(id) }
            if let sub = object["sub"] as? String, !sub.isEmpty {
                // A JSON boolean here (§9.2), but tolerate the string form as elsewhere (§12), and
                // its absence as for identity tokens: private only for a relay address.
                let email = object["email"] as? String
                let privateEmail = ((try? AppleJWSVerifier.privateEmail(object["is_private_email"], email: email)) ?? nil) ?? false
                return .subject(sub: sub, email: email, privateEmail: privateEmail)
            }
            return .transient(reason: "usermigrationinfo: 200 without transfer_sub or sub")
        }
        if status == 429 || status >= 500 {
            return .transient(reason: "usermigrationinfo: status \(status)", retryAfter: retryAfter.flatMap { Self.retryAfterSeconds($0, now: Date()) })
        }
        switch status == 400 ? errorCode(body) : nil {
        case "invalid_request": return .refused(reason: "invalid_request")
        case "invalid_client", "unauthorized_client", "invalid_grant", "invalid_scope": return .clientMisconfigured(error: errorCode(body) ?? "invalid_client")
        default: return .transient(reason: "usermigrationinfo: status \(status)")
        }
    }

    private func token(_ fields: [(String, String)], isRefresh: Bool) async -> AppleTokenOutcome {
        switch await post("/auth/token", fields) {
        case .failure(let failure):
            return .transient(reason: failure.reason)
        case .success(let (status, body, retryAfter)):
            return Self.classify(status: status, body: body, retryAfter: retryAfter, isRefresh: isRefresh)
        }
    }

    static func classify(status: Int, body: [UInt8], retryAfter: String? = nil, isRefresh: Bool) -> AppleTokenOutcome {
        if status == 200 {
            guard let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any],
                  let access = object["access_token"] as? String else { return .transient(reason: "token: 200 without the documented JSON") }
            return .success(AppleTokens(accessToken: access, refreshToken: object["refresh_token"] as? String,
                                        idToken: object["id_token"] as? String, expiresIn: (object["expires_in"] as? NSNumber)?.intValue))
        }
        let advice = retryAfter.flatMap { Self.retryAfterSeconds($0, now: Date()) }
        if status == 429 { return .throttled(retryAfter: advice) }
        if status >= 500 { return .transient(reason: "token: status \(status)", retryAfter: advice) }
        guard status == 400, let error = errorCode(body) else { return .transient(reason: "token: status \(status) without a documented error") }
        switch error {
        case "invalid_grant": return .grantRevoked(error: error)
        case "invalid_request": return isRefresh ? .grantRevoked(error: error) : .clientMisconfigured(error: error)
        case "invalid_client", "unauthorized_client", "unsupported_grant_type", "invalid_scope": return .clientMisconfigured(error: error)
        default: return .transient(reason: "token: unknown error")
        }
    }

    /// The `error` member of Apple's JSON error body (bounded set: used as a label).
    static func errorCode(_ body: [UInt8]) -> String? {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any], let error = object["error"] as? String,
              ["invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type", "invalid_scope"].contains(error)
        else { return nil }
        return error
    }

    /// A `Retry-After` value in seconds from `now`: delta-seconds or an HTTP-date (RFC 9110
    /// §10.2.3); nil when absent, malformed or in the past. At most a week (a typo must not stop
    /// re-validation for good).
    static func retryAfterSeconds(_ value: String, now: Date) -> Int? {
        let v = value.trimmingCharacters(in: .whitespaces)
        let seconds: Int
        if let delta = Int(v), delta >= 0, v.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            seconds = delta
        } else {
            let format = DateFormatter()
            format.locale = Locale(identifier: "en_US_POSIX")
            format.timeZone = TimeZone(identifier: "GMT")
            format.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
            guard let date = format.date(from: v) else { return nil }
            seconds = Int(date.timeIntervalSince(now).rounded(.up))
        }
        return seconds > 0 ? min(seconds, 7 * 86_400) : nil
    }

    private func post(_ path: String, _ fields: [(String, String)], headers: [(String, String)] = []) async -> Result<(Int, [UInt8], String?), TransportFailure> {
        var request = HTTPClientRequest(url: baseURL + path)
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        for (name, value) in Self.traceFields { request.headers.add(name: name, value: value) }
        request.method = .POST
        request.headers.add(name: "content-type", value: "application/x-www-form-urlencoded")
        request.headers.add(name: "accept", value: "application/json")
        request.headers.add(name: "user-agent", value: AppleTokenEndpoint.userAgent)
        request.body = .bytes(ByteBuffer(string: FormEncoding.encode(fields)))
        do {
            let response = try await httpClient.execute(request, timeout: timeout)
            let body = try await response.body.collect(upTo: 1 << 20)
            return .success((Int(response.status.code), Array(body.readableBytesView), response.headers.first(name: "retry-after")))
        } catch let error as HTTPClientError where error == .deadlineExceeded || error == .readTimeout || error == .connectTimeout {
            return .failure(TransportFailure(reason: "\(path): timeout"))
        } catch {
            return .failure(TransportFailure(reason: "\(path): connection failed"))
        }
    }

    struct TransportFailure: Error { let reason: String }
}
