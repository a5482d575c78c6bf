#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The whole gateway configuration, as loaded from `conf/sessiongate.yaml`.
///
/// Every default here is the one `conf/sessiongate.yaml` documents. Modules receive the typed
/// sub-structures; only this module knows the file format.
public struct GatewayConfiguration: Sendable, Equatable {
    public var server = Server()
    /// Absent until the operator configures Sign in with Apple.
    public var apple: Apple? = nil
    public var session = Session()
    public var store = Store()
    public var identity = Identity()
    public var events = Events()
    /// `tracing`: nil when the file has no such section (nothing is traced).
    public var tracing: Tracing? = nil
    public var routes: [Route] = []

    public init() {}

    public struct Server: Sendable, Equatable {
        public var listen = ListenAddress(host: "0.0.0.0", port: 8080)
        /// The origin users see, e.g. `https://app.example.com` (no path).
        public var publicURL: String? = nil
        public var authPrefix = "/_auth"
        public var adminListen = ListenAddress(host: "127.0.0.1", port: 9091)
        /// Peers allowed to set `X-Forwarded-*`; everyone else's are replaced.
        public var trustedProxies: [CIDR] = []
        /// Hosts `rd` may send users to after sign-in besides our own origin and the routes'
        /// hosts: exact names, or `.example.com` for any subdomain.
        public var allowedRedirectHosts: [String] = []
        /// Origins besides `public_url` and the request's own host that may open WebSockets and
        /// post to the gateway's state-changing endpoints (`https://app.example.com`).
        public var allowedOrigins: [String] = []
        public var accessLog: AccessLogFormat = .text
        /// The main log on standard error.
        public var log = Log()
        public var timeouts = Timeouts()
        public var limits = Limits()
        /// TLS termination on `listen`; nil: plain HTTP.
        public var tls: TLSFiles? = nil
        /// A plain-HTTP listener that answers every request with a 308 to the https URL.
        public var redirectHTTPListen: ListenAddress? = nil
        /// HTTP/2 with prior knowledge (h2c) on a listener without `tls`: for a TLS terminator in
        /// front that speaks h2c. A connection that starts with the HTTP/2 preface gets HTTP/2,
        /// any other HTTP/1.1 as before.
        public var http2Cleartext = false
        /// The bounds of every HTTP/2 connection (`server.http2`).
        public var http2 = HTTP2()
        public init() {}
    }

    /// The bounds of an HTTP/2 connection, each against one kind of resource exhaustion.
    public struct HTTP2: Sendable, Equatable {
        /// Streams a client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); a stream
        /// over it is refused (RST_STREAM REFUSED_STREAM).
        public var maxConcurrentStreams = 100
        /// The largest request header list (SETTINGS_MAX_HEADER_LIST_SIZE: names and values plus
        /// 32 bytes a field, RFC 9113 §6.5.2), also the bound on the HEADERS and CONTINUATION
        /// bytes of one block; nil: `server.limits.max_header_bytes`.
        public var maxHeaderListSize: Int? = nil
        /// Streams a client may reset (RST_STREAM) within `streamResetWindow`; one more and the
        /// connection ends with GOAWAY (rapid reset, CVE-2023-44487).
        public var maxStreamResets = 200
        /// The window `maxStreamResets` counts over (fixed).
        public static let streamResetWindow: Duration = .seconds(10)

        /// `maxHeaderListSize`, or the HTTP/1 head bound when it is not set.
        public func headerListSize(_ limits: Limits) -> Int { maxHeaderListSize ?? limits.maxHeaderBytes }
        public init() {}
    }

    /// A protocol a TLS listener offers by ALPN (`server.tls.alpn`).
    public enum ApplicationProtocol: String, Sendable, Equatable, CaseIterable {
        case h2
        case http11 = "http/1.1"
    }

    /// A certificate (PEM, leaf first, chain after) and its private key (PEM).
    public struct TLSFiles: Sendable, Equatable {
        public var certificateFile: String
        public var privateKeyFile: String
        /// The protocols offered by ALPN, in the server's order of preference; a client that
        /// offers none of them (or no ALPN) gets HTTP/1.1.
        public var alpn: [ApplicationProtocol]
        /// HTTP/2 first, HTTP/1.1 for the clients that do not speak it.
        public static let defaultALPN: [ApplicationProtocol] = [.h2, .http11]
        public init(certificateFile: String, privateKeyFile: String, alpn: [ApplicationProtocol] = defaultALPN) {
            self.certificateFile = certificateFile
            self.privateKeyFile = privateKeyFile
            self.alpn = alpn
        }
    }

    public enum AccessLogFormat: String, Sendable, Equatable, CaseIterable {
        case text, json, off
    }

    public struct Log: Sendable, Equatable {
        public var format: LogFormat = .text
        public var level: LogLevel = .info
        public init() {}
    }

    public enum LogFormat: String, Sendable, Equatable, CaseIterable {
        case text, json
    }

    public enum LogLevel: String, Sendable, Equatable, CaseIterable {
        case debug, info, notice, warning, error
    }

    public struct Timeouts: Sendable, Equatable {
        /// Establishing a TCP connection to an upstream.
        public var upstreamConnect: Duration = .seconds(5)
        /// From the end of the request to the upstream's response head.
        public var upstreamResponse: Duration = .seconds(60)
        /// An open connection (client or upstream) with nothing moving.
        public var idle: Duration = .seconds(60)
        /// How long SIGTERM waits for in-flight requests.
        public var shutdown: Duration = .seconds(30)
        /// After SIGTERM, before the drain: `/readyz` already answers 503 while the listener
        /// still accepts and serves, so that a load balancer (a Kubernetes Service's endpoints)
        /// stops sending before the port closes. 0: drain at once.
        public var drainDelay: Duration = .zero
        /// A request body must arrive completely within this time of the request head, plus a
        /// second per KiB received and any time the gateway held the client back; then 408 (or
        /// the connection is aborted if the upstream already answered).
        public var requestBody: Duration = .seconds(60)
        /// A TLS client must finish its handshake within this time of connecting.
        public var tlsHandshake: Duration = .seconds(10)
        /// From the first byte of a request to the end of its head; then 408 and close (a client
        /// trickling header lines no longer keeps its connection by resetting the idle timer).
        public var requestHead: Duration = .seconds(30)
        public init() {}
    }

    public struct Limits: Sendable, Equatable {
        /// Request line plus header block, in bytes; beyond it: 431.
        public var maxHeaderBytes = 16 * 1024
        /// Number of header fields; beyond it: 431.
        public var maxHeaderCount = 100
        /// Largest request body forwarded to an upstream, in bytes; beyond it: 413. 0: no limit
        /// (routes may set their own `max_body_bytes`).
        public var maxBodyBytes = 0
        /// Open client connections per instance; beyond it: 503 with `Retry-After`, closed. 0: no cap.
        public var maxConnections = 0
        /// Open client connections per client address (the forwarded one behind
        /// `server.trusted_proxies`, else the peer's); beyond it: 503, closed. 0: no cap.
        public var maxConnectionsPerClient = 0
        /// Idle upstream connections kept per instance, all upstreams and users together (split
        /// across the event loops); beyond it the least recently used closes.
        public var maxIdleUpstreamConnections = 512
        public init() {}
    }

    public struct Apple: Sendable, Equatable {
        public var teamID = ""
        public var clientIDs: [String] = []
        public var keyID = ""
        public var privateKeyFile: SecretReference = .file("")
        public var baseURL = "https://appleid.apple.com"
        public var scopes: [String] = ["name", "email"]
        public var revalidateAfter: Duration = .seconds(86_400)
        public var revalidateGrace: Duration = .seconds(3600)
        public var outageGrace: Duration = .seconds(72 * 3600)
        public var timeout: Duration = .seconds(5)
        /// Clock skew tolerated on Apple's tokens (`iat`, `exp`); the client secret's `iat` is
        /// set this far in the past.
        public var clockSkew: Duration = .seconds(60)
        /// Whether `/_auth/native` demands a nonce issued by `/_auth/native/nonce`.
        public var nativeNonce: NativeNonce = .optional
        /// Code exchanges per minute per user (native) or client address (web), per instance;
        /// 0: no limit.
        public var exchangesPerMinute = 30
        /// Login states (`/login`) and native nonces (`/native/nonce`) per minute per client
        /// address (an IPv6 client: its /64), each endpoint counted apart, per instance; 0: no limit.
        public var loginsPerMinute = 60
        /// Login states and native nonces one instance writes per 10 minutes (their lifetime), all
        /// clients together; at most twice this many are outstanding from it. 0: no cap.
        public var maxPendingLogins = 10_000
        /// Apple's app groups (consent is per group): each lists client ids of `clientIDs`, the
        /// primary App ID first; nil: all of them are one group.
        public var appGroups: [[String]]? = nil
        public init() {}
    }

    public enum NativeNonce: String, Sendable, CaseIterable {
        case required, optional
    }

    public struct Session: Sendable, Equatable {
        public var cookieName = "__Host-sessiongate"
        /// `Domain` of the session cookie: the parent domain whose hosts share one sign-in
        /// (`nil`: host-only; other hosts sign in by a one-time ticket).
        public var cookieDomain: String? = nil
        public var secretFile: SecretReference? = nil
        public var idleTimeout: Duration = .seconds(12 * 3600)
        public var absoluteTimeout: Duration = .seconds(30 * 86_400)
        public init() {}
    }

    public struct Store: Sendable, Equatable {
        /// `nil`: the in-memory store (one instance only).
        public var redisURL: RedisURL? = nil
        public var keyPrefix = "sg:"
        public var timeout: Duration = .milliseconds(250)
        public var localCacheTTL: Duration = .seconds(5)
        /// Sessions the local cache holds at most (shared by every event loop); beyond it the
        /// least recently used are evicted.
        public var localCacheEntries = 100_000
        /// TLS settings for a `rediss://` URL.
        public var tls = StoreTLS()
        /// Ask Redis Sentinel for the master instead of dialling `redis_url`'s host.
        public var sentinel: Sentinel? = nil
        /// A Redis Cluster: its nodes instead of `redis_url`'s host.
        public var cluster: Cluster? = nil
        /// Where revocations the store did not take (an outage) are kept until it does, across
        /// restarts (`held-revocations.jsonl`); nil: in memory only.
        public var stateDir: String? = nil
        public init() {}
    }

    /// Redis Cluster: the nodes asked for the slot map (`redis_url` gives the scheme and credentials).
    public struct Cluster: Sendable, Equatable {
        public var addresses: [ListenAddress]
        public init(addresses: [ListenAddress]) { self.addresses = addresses }
    }

    /// How a `rediss://` connection verifies the server and, for mutual TLS, presents itself.
    public struct StoreTLS: Sendable, Equatable {
        /// Trusted CA certificates (PEM); nil: the system trust store.
        public var caFile: String? = nil
        /// Client certificate and key (PEM), for servers with `tls-auth-clients yes`.
        public var certificateFile: String? = nil
        public var privateKeyFile: String? = nil
        /// The name the server's certificate must carry (and SNI); nil: the host dialled.
        public var serverName: String? = nil
        public init() {}
    }

    public struct Sentinel: Sendable, Equatable {
        public var masterName: String
        public var addresses: [ListenAddress]
        /// AUTH for the sentinels themselves (`requirepass` in sentinel.conf).
        public var password: SecretReference? = nil
        public init(masterName: String, addresses: [ListenAddress]) {
            self.masterName = masterName
            self.addresses = addresses
        }
    }

    /// What the gateway tells the app behind it (account deleted, consent revoked, email
    /// changed, session ended): POSTed, signed with the identity-assertion key, at least once.
    public struct Events: Sendable, Equatable {
        /// Where every kind goes (nil: no events unless `urls` names the kind).
        public var url: String? = nil
        /// A URL per kind (`user.deleted`, …), over `url`.
        public var urls: [String: String] = [:]
        /// Each delivery attempt.
        public var timeout: Duration = .seconds(5)
        public var isEnabled: Bool { url != nil || !urls.isEmpty }
        public static let kinds = Kind.allCases.map(\.rawValue)
        public init() {}
    }

    /// OpenTelemetry traces, exported over OTLP (`tracing`).
    public struct Tracing: Sendable, Equatable {
        public enum ExportProtocol: String, Sendable, CaseIterable {
            case httpProtobuf = "http/protobuf"
            case grpc
        }

        /// OTLP/HTTP: the whole URL spans are posted to; gRPC: the collector's `http://` or
        /// `https://` address.
        public var endpoint = "http://127.0.0.1:4318/v1/traces"
        public var exportProtocol = ExportProtocol.httpProtobuf
        /// The share of new traces recorded (0 to 1); a trusted caller's decision is kept.
        public var sampleRatio = 1.0
        /// Sent with every export (a vendor's API key).
        public var headers: [String: String] = [:]
        /// Spans carry the user's Apple `sub` (`enduser.id`).
        public var includeUser = false
        public var serviceName = "sessiongate"
        /// Each export attempt.
        public var timeout: Duration = .seconds(10)
        /// Spans waiting for export; more are dropped (and counted) rather than slow a request.
        public var maxQueue = 4096
        public init() {}
    }

    public struct Identity: Sendable, Equatable {
        public var assertion = Assertion()
        public var headers = IdentityHeaderNames()
        /// Every client header under this prefix is removed (any case, `_` or `-`), not only the
        /// configured names. Empty: only the configured names.
        public var headerPrefix = "X-Auth-"
        /// More header names removed from every client request on every route, like the
        /// identity headers (any case, `_` or `-`), beside the names other authenticating proxies
        /// set, which are always removed (`Remote-User`, …; the README's table). For an app that
        /// trusts a header of its own (`X-Legacy-Login`). Default: none.
        public var stripHeaders: [String] = []
        /// The bearer secret of `POST/DELETE /_auth/links` (nil: no links API).
        public var linksSecretFile: SecretReference? = nil
        /// Where a route with `require_link` sends an unlinked user: the app's page that checks
        /// the legacy credentials and calls `/_auth/links` (a path or an http(s) URL).
        public var linkURL: String? = nil
        /// Asked at a sign-in of a user with no link, with a verified, non-relay email: the
        /// app answers the account that email belongs to (if any), and the gateway links it.
        public var linkLookupURL: String? = nil
        public init() {}

        public struct Assertion: Sendable, Equatable {
            public var enabled = false
            public var keyFile: SecretReference? = nil
            public var ttl: Duration = .seconds(60)
            public init() {}
        }
    }

    public struct Route: Sendable, Equatable {
        public var name: String
        /// Lower-cased host the route answers for (port ignored); `nil` answers any host.
        public var host: String?
        public var pathPrefix: String
        public var upstream: UpstreamURL
        public var auth: AuthMode
        public var allow: Allow
        public var unauthenticated: UnauthenticatedAction
        /// Overrides `server.limits.max_body_bytes` for this route (0: no limit).
        public var maxBodyBytes: Int? = nil
        /// Forward `TRACE` (otherwise 405).
        public var allowTrace = false
        /// The upstream sees paths without `pathPrefix`.
        public var stripPrefix = false
        /// The `Host` the upstream receives (`host` or `host:port`); nil: the client's.
        public var upstreamHost: String? = nil
        /// Where `/_auth/logout` sends a browser that signed out from this route (`rd`).
        public var postLogoutRedirect: String? = nil
        /// https upstreams: CA certificates (PEM) to verify it with; nil: the system trust store.
        public var upstreamCAFile: String? = nil
        /// https upstreams: the name sent as SNI and required in its certificate; nil: the host.
        public var upstreamServerName: String? = nil
        /// https upstreams, tests only: no certificate verification (`check` warns).
        public var upstreamInsecureSkipVerify = false
        /// A signed-in user whose Apple identity is linked to no account of the app is sent to
        /// `identity.link_url` (browsers) or refused 403 (scripts).
        public var requireLink = false
        /// Which requests an upstream connection may carry over its life (`principal`: one
        /// user's, or one client connection's when anonymous).
        public var upstreamReuse: UpstreamReuse = .principal
        /// Requests of this route admitted and not yet answered, per instance; beyond it: 503
        /// with `Retry-After` at once. 0: no bound.
        public var maxInFlight = 0
        /// Connections to the upstream per instance, in use and idle (0: no bound); a request
        /// over it takes an idle connection's place or waits up to `upstream_connect`, then 503.
        public var upstreamMaxConnections = Route.defaultUpstreamMaxConnections
        public static let defaultUpstreamMaxConnections = 1024
        /// CORS preflights on a guarded route.
        public var preflight: Preflight = .authenticate

        public init(
            name: String, host: String? = nil, pathPrefix: String = "/", upstream: UpstreamURL,
            auth: AuthMode = .required, allow: Allow = Allow(), unauthenticated: UnauthenticatedAction = .redirect
        ) {
            self.name = name
            self.host = host
            self.pathPrefix = pathPrefix
            self.upstream = upstream
            self.auth = auth
            self.allow = allow
            self.unauthenticated = unauthenticated
        }
    }

    public enum AuthMode: String, Sendable, Equatable, CaseIterable {
        case required, optional, `public`
    }

    public enum UnauthenticatedAction: String, Sendable, Equatable, CaseIterable {
        case redirect, deny
    }

    /// What a guarded route does with a CORS preflight (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`), which by the Fetch standard carries no credentials.
    public enum Preflight: String, Sendable, Equatable, CaseIterable {
        /// As any request: a session is needed (so a cross-origin API client's preflight fails).
        case authenticate
        /// Forwarded to the app without a session (the app answers the CORS headers), identity
        /// headers stripped as always (oauth2-proxy's `--skip-auth-preflight`).
        case pass
    }

    /// How a route's upstream connections are reused (README: "Upstream connections and users").
    public enum UpstreamReuse: String, Sendable, Equatable, CaseIterable {
        /// A connection serves one principal for its whole life: a signed-in user (`sub`), or the
        /// one client connection an anonymous request came on. An app's framing mistake can show
        /// a user only their own bytes.
        case principal
        /// Any request may take any idle connection (nginx, HAProxy, Envoy): fewer connections,
        /// and an app's framing mistake can show one user another's page.
        case shared
        /// Any request without a body may take any idle connection, and every response must
        /// echo the request's `X-Request-Id` — the gateway's own, unpredictable, for each request
        /// — or it is refused (502) and its connection closed: late bytes of one response can
        /// never pass as another's. Requests with a body get a connection of their own, as in
        /// `principal`.
        case echo
        /// A new connection for every request, closed after it.
        case none
    }

    public struct Allow: Sendable, Equatable {
        public var users: [String] = []
        public var emails: [String] = []
        public var emailDomains: [String] = []
        public init() {}
    }
}

/// Names of the identity headers sent upstream (and stripped from every client request).
public struct IdentityHeaderNames: Sendable, Equatable {
    public var user = "X-Auth-User"
    public var email = "X-Auth-Email"
    public var emailVerified = "X-Auth-Email-Verified"
    public var privateEmail = "X-Auth-Private-Email"
    public var emailForwarding = "X-Auth-Email-Forwarding"
    public var name = "X-Auth-Name"
    public var realUserStatus = "X-Auth-Real-User-Status"
    /// The legacy app's account id linked to the Apple identity (absent when unlinked).
    public var account = "X-Auth-Account"
    /// The user's `sub` at the team the app was transferred from, during the transfer period
    /// after the gateway mapped them (absent otherwise): the app re-keys its rows with it.
    public var formerUser = "X-Auth-Former-User"
    public var assertion = "X-Auth-Assertion"
    public init() {}

    public var all: [String] { [user, email, emailVerified, privateEmail, emailForwarding, name, realUserStatus, account, formerUser, assertion] }
}

/// Where a secret comes from: a file path, or an environment variable (`env:NAME`). Never inline.
public enum SecretReference: Sendable, Equatable, CustomStringConvertible {
    case file(String)
    case environment(String)

    public static func parse(_ text: String) -> SecretReference? {
        if text.hasPrefix("env:") {
            let name = String(text.dropFirst(4))
            guard let first = name.first, first == "_" || (first.isASCII && first.isLetter),
                  name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }) else { return nil }
            return .environment(name)
        }
        guard !text.isEmpty, !text.contains("\0") else { return nil }
        return .file(text)
    }

    public var description: String {
        switch self {
        case .file(let path): return path
        case .environment(let name): return "env:\(name)"
        }
    }
}

/// `redis://[:password@]host[:port][/db]` (or `rediss://`).
public struct RedisURL: Sendable, Equatable {
    public var host: String
    public var port: Int
    public var database: Int
    public var password: String?
    public var username: String?
    public var tls: Bool

    public static func parse(_ text: String) -> RedisURL? {
        let tls: Bool
        var rest: Substring
        if text.hasPrefix("redis://") { tls = false; rest = text.dropFirst(8) }
        else if text.hasPrefix("rediss://") { tls = true; rest = text.dropFirst(9) }
        else { return nil }
        var username: String? = nil
        var password: String? = nil
        if let at = rest.lastIndex(of: "@") {
            let userinfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            if let colon = userinfo.firstIndex(of: ":") {
                let u = userinfo[..<colon]
                username = u.isEmpty ? nil : String(u).removingPercentEncodingSimple
                password = String(userinfo[userinfo.index(after: colon)...]).removingPercentEncodingSimple
            } else {
                password = String(userinfo).removingPercentEncodingSimple
            }
        }
        var database = 0
        if let slash = rest.firstIndex(of: "/") {
            let db = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
            if !db.isEmpty {
                guard let n = Int(db), n >= 0, db.allSatisfy(\.isNumber) else { return nil }
                database = n
            }
        }
        let authority = String(rest)
        let address = ListenAddress.parse(authority) ?? ListenAddress.parse(authority + ":6379")
        guard let address, address.port > 0 else { return nil }
        return RedisURL(host: address.host, port: address.port, database: database, password: password, username: username, tls: tls)
    }
}

extension String {
    /// Percent-decoding of ASCII-safe text (passwords in URLs); anything but `%` and two hex
    /// digits is kept as written (`%+f` is not an escape, though `UInt8("+f", radix: 16)` reads it).
    var removingPercentEncodingSimple: String {
        func hex(_ b: UInt8) -> UInt8? {
            switch b {
            case 0x30...0x39: b - 0x30
            case 0x41...0x46: b - 0x37
            case 0x61...0x66: b - 0x57
            default: nil
            }
        }
        var bytes: [UInt8] = []
        var utf8 = Array(self.utf8)[...]
        while let b = utf8.popFirst() {
            if b == UInt8(ascii: "%"), utf8.count >= 2, let hi = hex(utf8[utf8.startIndex]), let lo = hex(utf8[utf8.startIndex + 1]) {
                bytes.append(hi << 4 | lo)
                utf8 = utf8.dropFirst(2)
            } else {
                bytes.append(b)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}


extension SecretReference {
    /// The secret's bytes: the file's content, or the environment variable's value. A trailing
    /// newline (as `echo` or an editor leaves) is not part of the secret.
    /// - Parameter key: the config key path, for the error message.
    public func read(key: String) throws(StartupFailure) -> [UInt8] {
        func failure(_ reason: String) -> StartupFailure { StartupFailure(key: key, "cannot read \(self): \(reason)") }
        var bytes: [UInt8]
        switch self {
        case .environment(let name):
            guard let value = getenv(name) else { throw failure("the variable is not set") }
            bytes = Array(String(cString: value).utf8)
        case .file(let path):
            guard let handle = fopen(path, "rb") else { throw failure(String(cString: strerror(errno))) }
            defer { fclose(handle) }
            var status = stat()
            if fstat(fileno(handle), &status) == 0, (status.st_mode & S_IFMT) == S_IFDIR { throw failure("it is a directory") }
            bytes = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while true {
                let n = fread(&chunk, 1, chunk.count, handle)
                if n <= 0 { break }
                bytes += chunk[0..<n]
                if bytes.count > 1 << 20 { throw failure("larger than 1 MiB") }
            }
        }
        while bytes.last == UInt8(ascii: "\n") || bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        guard !bytes.isEmpty else { throw failure("it is empty") }
        return bytes
    }
}
