import Crypto
import Foundation
import AsyncHTTPClient
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix

/// A stand-in for `appleid.apple.com` on loopback, for tests, the demo and the bench
/// (apple-sign-in.md §14). This first slice serves the discovery document and the key set
/// with live rotation; the authorize, token, revoke and notification surfaces follow.
public final class SimulatedAppleID: Sendable {
    /// What the simulated Apple knows about the relying party's team.
    public struct Team: Sendable {
        public var teamID: String
        /// The team's Sign in with Apple keys (the public halves of the `.p8` files), by key id.
        public var keys: [String: P256.Signing.PublicKey]
        /// Registered client ids: a Services ID with its return URLs, or an App ID with none.
        public var clients: [String: [String]]
        /// Return URLs must be https to a domain name, as Apple requires (no IP address, no
        /// `localhost`); tests and the demo on one machine set this to accept a loopback host
        /// (localhost, 127.0.0.1, [::1]), over `http://` or `https://`.
        public var allowsLoopbackHTTP: Bool

        public init(teamID: String, keys: [String: P256.Signing.PublicKey], clients: [String: [String]] = [:], allowsLoopbackHTTP: Bool = false) {
            self.teamID = teamID
            self.keys = keys
            self.clients = clients
            self.allowsLoopbackHTTP = allowsLoopbackHTTP
        }

        /// Whether Apple would send a browser to `url` (apple-sign-in.md §1.1, §11.7): https, a
        /// domain name (no IP literal, no `localhost`), no fragment, no credentials; a loopback
        /// host over http or https only when allowed. Apple's answer to any other is
        /// `unauthorized_client` "Invalid web redirect url" at `/auth/authorize`.
        public func acceptsReturnURL(_ url: String) -> Bool {
            let lower = url.lowercased()
            guard let scheme = ["https://", "http://"].first(where: lower.hasPrefix), !lower.contains("#") else { return false }
            let authority = lower.dropFirst(scheme.count).prefix { $0 != "/" && $0 != "?" }
            guard !authority.isEmpty, !authority.contains("@") else { return false }
            let host = authority.hasPrefix("[") ? String(authority.prefix { $0 != "]" }) + "]" : String(authority.prefix { $0 != ":" })
            if ["localhost", "127.0.0.1", "[::1]"].contains(host) { return allowsLoopbackHTTP }
            return scheme == "https://" && Self.isDomainName(host)
        }

        /// A host name Apple registers: not an IP literal (v4 dotted digits, or bracketed v6),
        /// not `localhost` or under it (RFC 6761), with a dot.
        static func isDomainName(_ host: String) -> Bool {
            let name = host.hasSuffix(".") ? String(host.dropLast()) : host
            guard !name.isEmpty, !name.hasPrefix("["), name.contains(".") else { return false }
            if name == "localhost" || name.hasSuffix(".localhost") { return false }
            if name.allSatisfy({ $0.isNumber || $0 == "." }) { return false }
            return name.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-") }
        }
    }

    /// Behaviours tests and the bench switch on (apple-sign-in.md §12, §14).
    public struct Faults: Sendable {
        /// Refuse a refresh of the same token within this many seconds (0: never).
        public var throttleInterval: Int64 = 0
        public var throttleStatus = 429
        /// The front-channel `id_token` carries a `c_hash` of another code (a token swapped in).
        public var wrongCodeHash = false
        /// Identity tokens as from a platform without nonce support: no `nonce` claim,
        /// `nonce_supported: false` (apple-sign-in.md §6.3).
        public var nonceUnsupported = false
        /// Refuse every client secret with `invalid_client` (a revoked key, a wrong team: our
        /// misconfiguration as Apple sees it).
        public var rejectClientSecrets = false
        /// `Retry-After` (seconds) on throttled answers and on `tokenFailureStatus` answers; nil: none.
        public var retryAfter: Int? = nil
        /// Refresh responses carry an `id_token` (Apple has answered both ways).
        public var refreshReturnsIDToken = true
        /// Boolean claims as `"true"`/`"false"` strings instead of JSON booleans.
        public var stringBooleans = true
        /// Identity tokens of a user who shares their real email carry `is_private_email: false`
        /// (Apple's documented example) instead of no `is_private_email` at all (observed).
        public var statesSharedEmail = false
        /// Send `email-enabled`/`email-disabled` for a user who shares their real email. Apple
        /// sends them only for Hide My Email relay addresses: by default such a notification is
        /// not sent at all.
        public var emailEventsForSharedEmail = false
        /// Identity-token lifetime in seconds.
        public var idTokenTTL: Int64 = 600
        /// Consent without a page: `""` picks the first user (created if none), or a `sub`.
        public var autoConsent: String? = nil
        /// Added to every answer of `/auth/token`, `/auth/revoke` and `/auth/keys`, in ms.
        public var latencyMilliseconds: Int64 = 0
        /// Answer `/auth/token` with this status (e.g. 503) instead of working.
        public var tokenFailureStatus: Int? = nil
        /// Answer `/auth/revoke` with this status (e.g. 503) without revoking anything.
        public var revokeFailureStatus: Int? = nil
        /// Answer `/auth/keys` with this status (e.g. 503): Apple's key set unreachable.
        public var keysFailureStatus: Int? = nil
        /// `event_time` of notifications in milliseconds (as observed) instead of seconds.
        public var eventTimeInMilliseconds = true
        /// `account-delete` (observed) or `account-deleted` (current docs).
        public var accountDeleteType = "account-delete"
        /// The error a refresh of a revoked token gets: `invalid_grant` or `invalid_request`
        /// (both observed, apple-sign-in.md §12).
        public var revokedRefreshError = "invalid_grant"
        /// Every refresh answers `invalid_request`, as Apple answers a request our side
        /// malformed (a bug in the gateway, not the users' consent).
        public var refreshMalformed = false
        /// Refuse Basic credentials sent alongside form credentials (TN3107); lenient by default.
        public var strictClientAuthentication = false
        /// `/auth/revoke` of a token issued to another client: `invalid_grant` (else 200).
        public var rejectForeignRevoke = true
        /// Notifications carry `events` as a JSON object (Apple's docs) instead of a string (live).
        public var eventsAsObject = false
        /// Notifications carry `exp` (live) or not (Apple's examples).
        public var notificationIncludesExp = true
        /// `expires_in` of access tokens (3600 in Apple's examples, 300 seen elsewhere).
        public var accessTokenLifetime = 3600
        /// After `/auth/revoke` of a refresh token, send `consent-revoked` to the notification URL.
        public var notifyOnRevoke = false
        /// The next this many `user.migration` access tokens are dead from the start (as one Apple
        /// invalidates before its `expires_in`): `/auth/usermigrationinfo` refuses them with
        /// `invalid_request`, as it refuses an expired one.
        public var deadMigrationTokens = 0
        public init() {}
    }

    let team: Team
    let signingKeys: SigningKeys
    let clock: @Sendable () -> Int64
    let grants = NIOLockedValueBox(Grants())
    let faults = NIOLockedValueBox(Faults())
    let notifier: HTTPClient
    /// Where `/sim/notify` sends notifications when the request names no URL.
    public let notificationURL: String?
    let counters = NIOLockedValueBox<[String: Int]>([:])
    /// The last `traceparent` each path received (Apple ignores it; tests read what a caller propagates).
    let traceparents = NIOLockedValueBox<[String: String]>([:])
    /// App transfers, shared with the simulators of the other teams (`TransferLedger`).
    public let ledger: TransferLedger
    private let server: SimulatorHTTPServer

    /// The origin to use as `apple.base_url`, e.g. `http://127.0.0.1:41234`.
    public let baseURL: String

    private init(team: Team, signingKeys: SigningKeys, server: SimulatorHTTPServer, baseURL: String, clock: @escaping @Sendable () -> Int64,
                 notifier: HTTPClient, notificationURL: String?, ledger: TransferLedger) {
        self.ledger = ledger
        ledger.state.withLockedValue { _ = $0.teams.insert(team.teamID) }
        self.notifier = notifier
        self.notificationURL = notificationURL
        self.team = team
        self.clock = clock
        self.signingKeys = signingKeys
        self.server = server
        self.baseURL = baseURL
    }

    /// Starts the simulator on `host:port` (port 0 picks a free one).
    /// - Parameter clock: whole seconds since 1970 (injectable for tests).
    public static func start(
        team: Team, host: String = "127.0.0.1", port: Int = 0, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) },
        notificationURL: String? = nil, ledger: TransferLedger = TransferLedger()
    ) async throws -> SimulatedAppleID {
        let keys = try SigningKeys()
        let box = ResponderBox()
        let server = try await SimulatorHTTPServer.start(host: host, port: port, group: group) { request in
            box.simulator?.respond(request) ?? SimulatorResponse(status: .serviceUnavailable, "starting\n")
        }
        let bound = server.localAddress?.port ?? port
        let simulator = SimulatedAppleID(
            team: team, signingKeys: keys, server: server, baseURL: "http://\(host.contains(":") ? "[\(host)]" : host):\(bound)", clock: clock,
            notifier: HTTPClient(eventLoopGroupProvider: .shared(group)), notificationURL: notificationURL, ledger: ledger)
        box.simulator = simulator
        return simulator
    }

    public func stop() async {
        await server.close()
        try? await notifier.shutdown()
    }

    /// Adds a signing key and signs with it from now on (Apple rotates without notice);
    /// returns its key id.
    @discardableResult
    public func rotateKeys() throws -> String { try signingKeys.rotate() }

    /// Changes the simulator's behaviours (see `Faults`).
    public func setFaults(_ change: (inout Faults) -> Void) { faults.withLockedValue { change(&$0) } }

    /// The key ids currently published at `/auth/keys`.
    public var publishedKeyIDs: [String] { signingKeys.kids }

    /// How many requests reached `path` (e.g. `/auth/keys`); tests and the bench read these.
    public func requestCount(_ path: String) -> Int { counters.withLockedValue { $0[path] ?? 0 } }

    /// The `traceparent` the last request to `path` carried.
    public func lastTraceparent(_ path: String) -> String? { traceparents.withLockedValue { $0[path] } }

    func respond(_ request: SimulatorRequest) -> SimulatorResponse {
        let path = String(request.path)
        counters.withLockedValue { $0[path, default: 0] += 1 }
        if let traceparent = request.head.headers.first(name: "traceparent") { traceparents.withLockedValue { $0[path] = traceparent } }
        var response = route(request, path: path)
        if ["/auth/token", "/auth/revoke", "/auth/keys"].contains(path) {
            let latency = faults.withLockedValue { $0.latencyMilliseconds }
            if latency > 0 { response.delay = .milliseconds(latency) }
        }
        return response
    }

    func route(_ request: SimulatorRequest, path: String) -> SimulatorResponse {
        switch (request.head.method, path) {
        case (.GET, "/auth/keys"):
            if let status = faults.withLockedValue({ $0.keysFailureStatus }) {
                return Self.error(HTTPResponseStatus(statusCode: status), "server_error")
            }
            return (try? signingKeys.jwks()).map(Self.json) ?? Self.error(.internalServerError, "server_error")
        case (.GET, "/.well-known/openid-configuration"):
            return Self.json(discoveryDocument())
        case (.GET, "/auth/authorize"):
            return authorizeEndpoint(request)
        case (.POST, "/auth/authorize/consent"):
            return consentEndpoint(request)
        case (.POST, "/auth/token"):
            return tokenEndpoint(request)
        case (.POST, "/auth/revoke"):
            return revokeEndpoint(request)
        case (.POST, "/auth/usermigrationinfo"):
            return migrationEndpoint(request)
        case (_, _) where path.hasPrefix("/sim/"):
            return controlEndpoint(request, path: path)
        default:
            return Self.error(.notFound, "not_found")
        }
    }

    /// Apple's discovery document, with the host rewritten (apple-sign-in.md §0).
    func discoveryDocument() -> [String: Any] {
        [
            "issuer": "https://appleid.apple.com",
            "authorization_endpoint": "\(baseURL)/auth/authorize",
            "token_endpoint": "\(baseURL)/auth/token",
            "revocation_endpoint": "\(baseURL)/auth/revoke",
            "jwks_uri": "\(baseURL)/auth/keys",
            "response_types_supported": ["code"],
            "response_modes_supported": ["query", "fragment", "form_post"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "email", "name"],
            "token_endpoint_auth_methods_supported": ["client_secret_post"],
            "claims_supported": ["aud", "email", "email_verified", "exp", "iat", "is_private_email", "iss", "nonce", "nonce_supported", "real_user_status", "sub", "transfer_sub"],
        ]
    }

    static func json(_ object: [String: Any]) -> SimulatorResponse {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return SimulatorResponse(contentType: "application/json;charset=UTF-8", body: ByteBuffer(bytes: data), headers: [("pragma", "no-cache")])
    }

    static func error(_ status: HTTPResponseStatus, _ code: String, _ description: String? = nil) -> SimulatorResponse {
        var object: [String: Any] = ["error": code]
        if let description { object["error_description"] = description }
        var response = json(object)
        response.status = status
        return response
    }
}

/// Lets the server's responder reach the simulator, which is built after the server is bound.
private final class ResponderBox: Sendable {
    private let value = NIOLockedValueBox<SimulatedAppleID?>(nil)
    var simulator: SimulatedAppleID? {
        get { value.withLockedValue { $0 } }
        set { value.withLockedValue { $0 = newValue } }
    }
}
