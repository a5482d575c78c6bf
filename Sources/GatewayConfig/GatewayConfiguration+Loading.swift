import Yams

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension GatewayConfiguration {
    /// The outcome of loading: the configuration (when there is no error) and every problem.
    public struct LoadResult: Sendable {
        public var configuration: GatewayConfiguration?
        public var problems: [ConfigProblem]
        /// Where each key present in the file is, by key path (`server.listen`).
        public var locations: [String: ConfigLocation] = [:]
        public var errors: [ConfigProblem] { problems.filter { $0.severity == .error } }
        public var warnings: [ConfigProblem] { problems.filter { $0.severity == .warning } }
    }

    /// Reads and validates a configuration file. Reads the one file; connects to nothing.
    public static func load(file path: String) -> LoadResult {
        guard let handle = fopen(path, "rb") else {
            return LoadResult(configuration: nil, problems: [ConfigProblem(.error, path: "", message: "cannot read the file: \(String(cString: strerror(errno)))")])
        }
        defer { fclose(handle) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, handle)
            if n <= 0 { break }
            bytes += chunk[0..<n]
            if bytes.count > 4 << 20 {
                return LoadResult(configuration: nil, problems: [ConfigProblem(.error, path: "", message: "the file is larger than 4 MiB")])
            }
        }
        return parse(yaml: String(decoding: bytes, as: UTF8.self))
    }

    /// Parses and validates YAML text: every problem, each with its key path and line:column.
    public static func parse(yaml: String) -> LoadResult {
        let node: Node?
        do {
            node = try Yams.compose(yaml: yaml)
        } catch let error as YamlError {
            return LoadResult(configuration: nil, problems: [Self.problem(from: error)])
        } catch {
            return LoadResult(configuration: nil, problems: [ConfigProblem(.error, path: "", message: "not valid YAML")])
        }
        let reader = ConfigReader()
        var config = GatewayConfiguration()
        let top = ["server", "apple", "session", "store", "identity", "events", "routes"]
        guard let root = reader.section(node ?? Node(""), path: "", keys: top) else {
            return LoadResult(configuration: nil, problems: reader.problems)
        }
        config.readServer(reader, root)
        config.readApple(reader, root)
        config.readSession(reader, root)
        config.readStore(reader, root)
        config.readIdentity(reader, root)
        config.readEvents(reader, root)
        config.readRoutes(reader, root)
        config.crossCheck(reader, root)
        let problems = reader.problems
        let ok = !problems.contains { $0.severity == .error }
        return LoadResult(configuration: ok ? config : nil, problems: problems, locations: reader.locations)
    }

    private static func problem(from error: YamlError) -> ConfigProblem {
        switch error {
        case .scanner(_, let problem, let mark, _), .parser(_, let problem, let mark, _), .composer(_, let problem, let mark, _):
            return ConfigProblem(.error, path: "", line: mark.line, column: mark.column, message: "YAML syntax: \(problem)")
        case .duplicatedKeysInMapping(let duplicates, let context):
            return ConfigProblem(.error, path: "", line: context.mark.line, column: context.mark.column,
                                 message: "duplicate key \(duplicates.map { "'\($0)'" }.joined(separator: ", "))")
        default:
            return ConfigProblem(.error, path: "", message: "not valid YAML")
        }
    }

    // MARK: sections

    private mutating func readServer(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard let s = r.section(root.values["server"], path: "server", keys: [
            "listen", "public_url", "auth_prefix", "admin_listen", "trusted_proxies", "allowed_redirect_hosts", "allowed_origins", "tls", "access_log", "log", "timeouts",
            "limits", "redirect_http_listen",
        ]) else { return }
        if let text = r.string(s, "listen") {
            if let v = ListenAddress.parse(text) { server.listen = v }
            else { r.report(s.child("listen"), r.mark(s, "listen"), "'\(text)' is not host:port (e.g. 0.0.0.0:8080 or [::]:8080)") }
        }
        if let text = r.string(s, "admin_listen") {
            if let v = ListenAddress.parse(text) {
                server.adminListen = v
                if !v.isLoopback {
                    r.warn(s.child("admin_listen"), r.mark(s, "admin_listen"), "metrics and health are served on a non-loopback address; keep it off the public network")
                }
            } else { r.report(s.child("admin_listen"), r.mark(s, "admin_listen"), "'\(text)' is not host:port") }
        }
        if let text = r.string(s, "public_url") {
            if let origin = Self.parseOrigin(text) { server.publicURL = origin }
            else { r.report(s.child("public_url"), r.mark(s, "public_url"), "'\(text)' is not an origin like https://app.example.com (scheme and host, no path)") }
        }
        if let text = r.string(s, "auth_prefix") {
            let segments = text.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
            let ok = text.hasPrefix("/") && text.count > 1 && !text.hasSuffix("/")
                && segments.allSatisfy { !$0.isEmpty && $0 != "." && $0 != ".." && $0.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "-_.~".contains($0)) } }
            if ok { server.authPrefix = text }
            else { r.report(s.child("auth_prefix"), r.mark(s, "auth_prefix"), "'\(text)' must be a path like /_auth (leading /, no trailing /, letters, digits, - _ . ~)") }
        }
        if let v = r.list(s, "trusted_proxies", what: "an address or CIDR (e.g. 10.0.0.0/8)", parse: CIDR.parse) { server.trustedProxies = v }
        if let v = r.list(s, "allowed_redirect_hosts", what: "a host name (app.example.com) or a .suffix (.example.com)", parse: { text -> String? in
            let host = text.lowercased()
            let body = host.hasPrefix(".") ? host.dropFirst() : Substring(host)
            guard !body.isEmpty, body.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == ".") }),
                  !body.hasPrefix("."), !body.hasSuffix("."), !body.contains("..") else { return nil }
            return host
        }) { server.allowedRedirectHosts = v }
        if let v = r.list(s, "allowed_origins", what: "an origin like https://app.example.com (scheme and host, no path)", parse: Self.parseOrigin) {
            server.allowedOrigins = v
        }
        if let t = r.section(s.values["tls"], path: s.child("tls"), keys: ["certificate_file", "private_key_file"]) {
            let certificate = r.path(t, "certificate_file", required: "the PEM certificate, leaf first, then its chain")
            let key = r.path(t, "private_key_file", required: "the PEM private key of the certificate")
            if let certificate, let key { server.tls = TLSFiles(certificateFile: certificate, privateKeyFile: key) }
        }
        if let text = r.string(s, "redirect_http_listen") {
            if let v = ListenAddress.parse(text) { server.redirectHTTPListen = v }
            else { r.report(s.child("redirect_http_listen"), r.mark(s, "redirect_http_listen"), "'\(text)' is not host:port (e.g. 0.0.0.0:80)") }
        }
        if let v = r.enumeration(s, "access_log", as: AccessLogFormat.self) { server.accessLog = v }
        if let l = r.section(s.values["log"], path: s.child("log"), keys: ["format", "level"]) {
            if let v = r.enumeration(l, "format", as: LogFormat.self) { server.log.format = v }
            if let v = r.enumeration(l, "level", as: LogLevel.self) { server.log.level = v }
        }
        if let t = r.section(s.values["timeouts"], path: s.child("timeouts"), keys: ["upstream_connect", "upstream_response", "idle", "shutdown", "request_body", "tls_handshake", "request_head"]) {
            if let v = r.duration(t, "request_body") { server.timeouts.requestBody = v }
            if let v = r.duration(t, "request_head") { server.timeouts.requestHead = v }
            if let v = r.duration(t, "tls_handshake") { server.timeouts.tlsHandshake = v }
            if let v = r.duration(t, "upstream_connect") { server.timeouts.upstreamConnect = v }
            if let v = r.duration(t, "upstream_response") { server.timeouts.upstreamResponse = v }
            if let v = r.duration(t, "idle") { server.timeouts.idle = v }
            if let v = r.duration(t, "shutdown", atLeast: .zero) { server.timeouts.shutdown = v }
        }
        if let l = r.section(s.values["limits"], path: s.child("limits"), keys: ["max_header_bytes", "max_header_count", "max_body_bytes", "max_connections", "max_connections_per_client"]) {
            if let v = r.int(l, "max_connections", range: 0...10_000_000) { server.limits.maxConnections = v }
            if let v = r.int(l, "max_connections_per_client", range: 0...10_000_000) { server.limits.maxConnectionsPerClient = v }
            if let v = r.int(l, "max_body_bytes", range: 0...Int(Int64.max)) { server.limits.maxBodyBytes = v }
            if let v = r.int(l, "max_header_bytes", range: 1024...(1 << 20)) { server.limits.maxHeaderBytes = v }
            if let v = r.int(l, "max_header_count", range: 8...1000) { server.limits.maxHeaderCount = v }
        }
    }

    private mutating func readApple(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard root.values["apple"] != nil, let s = r.section(root.values["apple"], path: "apple", keys: [
            "team_id", "client_ids", "key_id", "private_key_file", "base_url", "scopes",
            "revalidate_after", "revalidate_grace", "outage_grace", "timeout", "clock_skew", "native_nonce", "exchanges_per_minute",
            "logins_per_minute", "max_pending_logins",
        ]) else { return }
        var apple = Apple()
        func required(_ key: String) -> String? {
            if s.values[key] == nil { r.report(s.child(key), s.mark, "is required"); return nil }
            return r.string(s, key)
        }
        if let v = required("team_id") {
            if GatewayConfiguration.Apple.isIdentifier(v) { apple.teamID = v }
            else { r.report(s.child("team_id"), r.mark(s, "team_id"), "'\(v)' is not a 10-character Apple Team ID (A-Z, 0-9)") }
        }
        if let v = required("key_id") {
            if GatewayConfiguration.Apple.isIdentifier(v) { apple.keyID = v }
            else { r.report(s.child("key_id"), r.mark(s, "key_id"), "'\(v)' is not a 10-character Apple Key ID (A-Z, 0-9)") }
        }
        if s.values["client_ids"] == nil { r.report(s.child("client_ids"), s.mark, "is required: your Services ID first, then any App IDs") }
        if let v = r.list(s, "client_ids", what: "a client id (e.g. com.example.web)", parse: { id in
            id.isEmpty || id.contains(where: { $0.isWhitespace || !$0.isASCII }) ? nil : id
        }) {
            if v.isEmpty { r.report(s.child("client_ids"), r.mark(s, "client_ids"), "needs at least one client id") }
            else if Set(v).count != v.count { r.report(s.child("client_ids"), r.mark(s, "client_ids"), "lists a client id twice") }
            else if v.count == 1 {
                r.warn(s.child("client_ids"), r.mark(s, "client_ids"),
                       "lists no App ID: Apple's server-to-server notifications (account deleted, consent revoked, email changes) name the primary App ID as their audience and would be refused; add it after the Services ID")
            }
            apple.clientIDs = v
        }
        if s.values["private_key_file"] == nil { r.report(s.child("private_key_file"), s.mark, "is required (the AuthKey_<key id>.p8 file, or env:NAME)") }
        if let v = r.string(s, "private_key_file") {
            if let ref = SecretReference.parse(v) { apple.privateKeyFile = ref }
            else { r.report(s.child("private_key_file"), r.mark(s, "private_key_file"), "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.string(s, "base_url") {
            if let origin = Self.parseOrigin(v) {
                apple.baseURL = origin
                if origin.hasPrefix("http://"), !Self.isLoopbackOrigin(origin) {
                    r.warn(s.child("base_url"), r.mark(s, "base_url"), "plain http to a non-loopback host: only for a simulator on a private network")
                }
            } else { r.report(s.child("base_url"), r.mark(s, "base_url"), "'\(v)' is not an origin like https://appleid.apple.com") }
        }
        if let v = r.list(s, "scopes", what: "a scope (name or email)", parse: { ["name", "email"].contains($0) ? $0 : nil }) { apple.scopes = v }
        if let v = r.duration(s, "revalidate_after", atLeast: .seconds(1)) {
            apple.revalidateAfter = v
            if v < .seconds(86_400) {
                r.warn(s.child("revalidate_after"), r.mark(s, "revalidate_after"), "Apple asks relying parties to validate a refresh token at most once a day; below 24h risks throttling")
            }
        }
        if let v = r.duration(s, "revalidate_grace", atLeast: .zero) { apple.revalidateGrace = v }
        if let v = r.duration(s, "outage_grace", atLeast: .zero) { apple.outageGrace = v }
        if let v = r.duration(s, "timeout") { apple.timeout = v }
        if let v = r.enumeration(s, "native_nonce", as: NativeNonce.self) { apple.nativeNonce = v }
        if let v = r.int(s, "exchanges_per_minute", range: 0...100_000) { apple.exchangesPerMinute = v }
        if let v = r.int(s, "logins_per_minute", range: 0...100_000) { apple.loginsPerMinute = v }
        if let v = r.int(s, "max_pending_logins", range: 0...10_000_000) { apple.maxPendingLogins = v }
        if let v = r.duration(s, "clock_skew", atLeast: .zero) {
            apple.clockSkew = v
            if v > .seconds(300) {
                r.warn(s.child("clock_skew"), r.mark(s, "clock_skew"), "more than 5m of tolerated skew lets expired identity tokens through for as long; fix the host's clock (NTP) instead")
            }
        }
        self.apple = apple
    }

    private mutating func readSession(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard let s = r.section(root.values["session"], path: "session", keys: ["cookie_name", "secret_file", "idle_timeout", "absolute_timeout"]) else { return }
        if let v = r.string(s, "cookie_name") {
            if Self.isToken(v) { session.cookieName = v }
            else { r.report(s.child("cookie_name"), r.mark(s, "cookie_name"), "'\(v)' is not a valid cookie name") }
        }
        if let v = r.string(s, "secret_file") {
            if let ref = SecretReference.parse(v) { session.secretFile = ref }
            else { r.report(s.child("secret_file"), r.mark(s, "secret_file"), "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.duration(s, "idle_timeout", atLeast: .seconds(1)) { session.idleTimeout = v }
        if let v = r.duration(s, "absolute_timeout", atLeast: .seconds(1)) { session.absoluteTimeout = v }
        if session.idleTimeout > session.absoluteTimeout {
            r.report(s.child("idle_timeout"), r.mark(s, "idle_timeout"), "is longer than session.absolute_timeout (\(ConfigDuration.format(session.absoluteTimeout)))")
        }
    }

    private mutating func readStore(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard let s = r.section(root.values["store"], path: "store", keys: ["redis_url", "key_prefix", "timeout", "local_cache_ttl", "local_cache_entries", "tls", "sentinel"]) else { return }
        if let v = r.string(s, "redis_url") {
            if let url = RedisURL.parse(v) { store.redisURL = url }
            else { r.report(s.child("redis_url"), r.mark(s, "redis_url"), "not a redis URL (redis://[user:password@]host[:port][/db], or rediss:// for TLS)") }
        }
        if let t = r.section(s.values["tls"], path: s.child("tls"), keys: ["ca_file", "certificate_file", "private_key_file", "server_name"]) {
            store.tls.caFile = r.path(t, "ca_file")
            store.tls.certificateFile = r.path(t, "certificate_file")
            store.tls.privateKeyFile = r.path(t, "private_key_file")
            if (store.tls.certificateFile == nil) != (store.tls.privateKeyFile == nil) {
                r.report(t.child(store.tls.certificateFile == nil ? "certificate_file" : "private_key_file"), t.mark,
                         "is required with store.tls.\(store.tls.certificateFile == nil ? "private_key_file" : "certificate_file"): a client certificate needs its key")
            }
            if let v = r.string(t, "server_name") {
                if Self.isHostName(v) { store.tls.serverName = v }
                else { r.report(t.child("server_name"), r.mark(t, "server_name"), "'\(v)' is not a host name") }
            }
            if store.redisURL?.tls != true {
                r.report(s.child("tls"), s.values["tls"]?.mark, "applies only to a rediss:// store.redis_url; write rediss:// to reach Redis over TLS")
            }
        }
        if let t = r.section(s.values["sentinel"], path: s.child("sentinel"), keys: ["master_name", "addresses", "password"]) {
            let name = r.string(t, "master_name")
            if t.values["master_name"] == nil { r.report(t.child("master_name"), t.mark, "is required (the name in sentinel.conf's 'sentinel monitor')") }
            let addresses = r.list(t, "addresses", what: "host:port of a sentinel (e.g. 10.0.0.1:26379)", parse: { text in
                ListenAddress.parse(text).flatMap { $0.port > 0 ? $0 : nil }
            }) ?? []
            if t.values["addresses"] == nil || addresses.isEmpty { r.report(t.child("addresses"), r.mark(t, "addresses"), "needs at least one sentinel host:port (three or more in production)") }
            var password: SecretReference? = nil
            if let v = r.string(t, "password") {
                password = SecretReference.parse(v)
                if password == nil { r.report(t.child("password"), r.mark(t, "password"), "'\(v)' is not a file path or env:NAME") }
            }
            if store.redisURL == nil {
                r.report(s.child("redis_url"), s.mark, "is required with store.sentinel: it gives the scheme, user, password and database of the master (its host is not dialled)")
            }
            if let name, !name.isEmpty, !addresses.isEmpty {
                var sentinel = Sentinel(masterName: name, addresses: addresses)
                sentinel.password = password
                store.sentinel = sentinel
            }
        }
        if let v = r.string(s, "key_prefix") {
            if !v.isEmpty, !v.contains(where: { $0.isWhitespace || $0 == "{" || $0 == "}" }) { store.keyPrefix = v }
            else { r.report(s.child("key_prefix"), r.mark(s, "key_prefix"), "must be non-empty, without spaces or braces") }
        }
        if let v = r.duration(s, "timeout") { store.timeout = v }
        if let v = r.duration(s, "local_cache_ttl", atLeast: .zero) { store.localCacheTTL = v }
        if let v = r.int(s, "local_cache_entries", range: 1...100_000_000) { store.localCacheEntries = v }
    }

    private mutating func readEvents(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard root.values["events"] != nil, let s = r.section(root.values["events"], path: "events", keys: ["url", "urls", "timeout"]) else { return }
        func webURL(_ value: String, _ path: String, _ mark: Mark?) -> String? {
            guard Self.isWebURL(value) else {
                r.report(path, mark, "'\(value)' is not an http:// or https:// URL with a host")
                return nil
            }
            return value
        }
        if let v = r.string(s, "url") { events.url = webURL(v, s.child("url"), r.mark(s, "url")) }
        if let u = r.section(s.values["urls"], path: s.child("urls"), keys: Events.kinds) {
            for kind in Events.kinds {
                if let v = r.string(u, kind), let url = webURL(v, u.child(kind), r.mark(u, kind)) { events.urls[kind] = url }
            }
        }
        if let v = r.duration(s, "timeout", atLeast: .milliseconds(100)) { events.timeout = v }
        if events.isEnabled, !identity.assertion.enabled {
            r.report("events", s.mark, "needs identity.assertion (enabled, with key_file): events are signed with that key, and the app verifies them with /_auth/jwks.json")
        }
    }

    /// `http://` or `https://`, a host, then an optional port and path: no credentials, no
    /// fragment, no spaces or control characters.
    public static func isWebURL(_ value: String) -> Bool {
        let lower = value.lowercased()
        guard let rest = ["http://", "https://"].first(where: lower.hasPrefix).map({ value.dropFirst($0.count) }) else { return false }
        guard !value.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7f }), !value.contains("#") else { return false }
        let authority = rest.prefix { $0 != "/" && $0 != "?" }
        guard !authority.contains("@") else { return false }
        let host = authority.hasPrefix("[") ? authority.prefix { $0 != "]" } : authority.prefix { $0 != ":" }
        return !host.isEmpty && host != "["
    }

    private mutating func readIdentity(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard let s = r.section(root.values["identity"], path: "identity", keys: ["assertion", "headers", "header_prefix", "strip_headers", "links", "link_url", "link_lookup_url"]) else { return }
        if let v = r.string(s, "link_url") {
            let isPath = v.hasPrefix("/") && !v.hasPrefix("//") && !v.contains("\\") && v.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f })
            if isPath || Self.isWebURL(v) { identity.linkURL = v }
            else { r.report(s.child("link_url"), r.mark(s, "link_url"), "'\(v)' is not a path (/link-account) or an http(s) URL") }
        }
        if let l = r.section(s.values["links"], path: s.child("links"), keys: ["secret_file"]), let v = r.string(l, "secret_file") {
            if let ref = SecretReference.parse(v) { identity.linksSecretFile = ref }
            else { r.report(l.child("secret_file"), r.mark(l, "secret_file"), "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.string(s, "link_lookup_url") {
            if Self.isWebURL(v) { identity.linkLookupURL = v }
            else { r.report(s.child("link_lookup_url"), r.mark(s, "link_lookup_url"), "'\(v)' is not an http:// or https:// URL with a host") }
            if identity.linksSecretFile == nil {
                r.report(s.child("link_lookup_url"), r.mark(s, "link_lookup_url"), "needs identity.links.secret_file: the gateway sends it as the bearer token, so the app knows who asks")
            }
        }
        if let v = r.string(s, "header_prefix") {
            // A prefix of a header name: a token, and long enough not to swallow ordinary headers.
            if v.isEmpty || (Self.isToken(v) && v.count >= 3) { identity.headerPrefix = v }
            else { r.report(s.child("header_prefix"), r.mark(s, "header_prefix"), "'\(v)' is not a header-name prefix like X-Auth- (at least 3 characters; empty turns it off)") }
        }
        if let v = r.list(s, "strip_headers", what: "a header name (X-Legacy-User)", parse: { Self.isToken($0) ? $0 : nil }) {
            identity.stripHeaders = v
        }
        if let a = r.section(s.values["assertion"], path: s.child("assertion"), keys: ["enabled", "key_file", "ttl"]) {
            if let v = r.bool(a, "enabled") { identity.assertion.enabled = v }
            if let v = r.string(a, "key_file") {
                if let ref = SecretReference.parse(v) { identity.assertion.keyFile = ref }
                else { r.report(a.child("key_file"), r.mark(a, "key_file"), "'\(v)' is not a file path or env:NAME") }
            }
            if let v = r.duration(a, "ttl", atLeast: .seconds(1)) { identity.assertion.ttl = v }
            if identity.assertion.enabled, identity.assertion.keyFile == nil {
                r.report(a.child("key_file"), a.mark, "is required when assertion.enabled is true")
            }
        }
        let keys: [(String, WritableKeyPath<IdentityHeaderNames, String>)] = [
            ("user", \.user), ("email", \.email), ("email_verified", \.emailVerified), ("private_email", \.privateEmail),
            ("email_forwarding", \.emailForwarding), ("name", \.name), ("real_user_status", \.realUserStatus), ("account", \.account), ("assertion", \.assertion),
        ]
        if let h = r.section(s.values["headers"], path: s.child("headers"), keys: keys.map(\.0)) {
            for (key, path) in keys {
                guard let v = r.string(h, key) else { continue }
                if Self.isToken(v) { identity.headers[keyPath: path] = v }
                else { r.report(h.child(key), r.mark(h, key), "'\(v)' is not a valid header name") }
            }
            let normalized = identity.headers.all.map { $0.lowercased().replacingUnderscores }
            if Set(normalized).count != normalized.count {
                r.report(s.child("headers"), s.values["headers"]?.mark, "two identity headers have the same name (case, '_' and '-' do not distinguish names)")
            }
        }
    }

    private mutating func readRoutes(_ r: ConfigReader, _ root: ConfigReader.Section) {
        guard let list = r.sequence(root, "routes") else {
            if root.values["routes"] == nil { r.report("routes", nil, "at least one route is required") }
            return
        }
        if list.isEmpty { r.report("routes", root.values["routes"]?.mark, "at least one route is required") }
        var seenNames: [String: Int] = [:]
        var seenMatches: [String: Int] = [:]
        for (index, node) in list.enumerated() {
            let path = "routes[\(index)]"
            guard let s = r.section(node, path: path, keys: [
                "name", "host", "path_prefix", "upstream", "auth", "allow", "unauthenticated", "max_body_bytes", "allow_trace",
                "strip_prefix", "upstream_host", "post_logout_redirect", "upstream_ca_file", "upstream_server_name", "upstream_insecure_skip_verify",
                "require_link", "upstream_reuse", "max_in_flight",
            ]) else { continue }
            let name = r.string(s, "name") ?? ""
            if s.values["name"] == nil { r.report(s.child("name"), s.mark, "is required") }
            else if name.isEmpty || !name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }) {
                r.report(s.child("name"), r.mark(s, "name"), "'\(name)' must be letters, digits, - or _ (it labels metrics)")
            } else if let first = seenNames[name] {
                r.report(s.child("name"), r.mark(s, "name"), "'\(name)' is already the name of routes[\(first)]")
            } else { seenNames[name] = index }

            var host: String? = nil
            if let v = r.string(s, "host") {
                // Normalized as requests' hosts are: lower case, one trailing dot removed.
                var lower = v.lowercased()
                if lower.hasSuffix(".") { lower.removeLast() }
                let ok = !lower.isEmpty && lower.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-" || $0 == "_") }
                    && !lower.hasPrefix(".") && !lower.contains("..")
                if ok { host = lower } else { r.report(s.child("host"), r.mark(s, "host"), "'\(v)' is not a host name (no port, no scheme)") }
            }
            var prefix = "/"
            if let v = r.string(s, "path_prefix") {
                if Self.isCanonicalPrefix(v) { prefix = v }
                else { r.report(s.child("path_prefix"), r.mark(s, "path_prefix"), "'\(v)' must be a canonical path starting with / (no dot segments, no %, no //, no query)") }
            }
            var upstream: UpstreamURL? = nil
            if s.values["upstream"] == nil { r.report(s.child("upstream"), s.mark, "is required (e.g. http://127.0.0.1:9000)") }
            else if let v = r.string(s, "upstream") {
                switch UpstreamURL.parse(v) {
                case .success(let u): upstream = u
                case .failure(.scheme): r.report(s.child("upstream"), r.mark(s, "upstream"), "'\(v)': an upstream is http://host:port or https://host:port")
                case .failure(.path): r.report(s.child("upstream"), r.mark(s, "upstream"), "'\(v)': an upstream is an origin (http://host:port), without path or query")
                case .failure(.authority): r.report(s.child("upstream"), r.mark(s, "upstream"), "'\(v)' has no valid host:port")
                }
            }
            let auth = r.enumeration(s, "auth", as: AuthMode.self) ?? .required
            let unauthenticated = r.enumeration(s, "unauthenticated", as: UnauthenticatedAction.self) ?? .redirect
            var allow = Allow()
            if let a = r.section(s.values["allow"], path: s.child("allow"), keys: ["users", "emails", "email_domains"]) {
                allow.users = r.list(a, "users", what: "an Apple user id (sub)", parse: { $0.isEmpty ? nil : $0 }) ?? []
                allow.emails = r.list(a, "emails", what: "an email address", parse: { e in
                    e.filter { $0 == "@" }.count == 1 && !e.hasPrefix("@") && !e.hasSuffix("@") ? e.lowercased() : nil
                }) ?? []
                allow.emailDomains = r.list(a, "email_domains", what: "a domain (example.com)", parse: { d in
                    !d.isEmpty && !d.contains("@") && d.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "-") }) ? d.lowercased() : nil
                }) ?? []
                if auth == .public, !(allow.users.isEmpty && allow.emails.isEmpty && allow.emailDomains.isEmpty) {
                    r.report(s.child("allow"), s.values["allow"]?.mark, "an allow list has no effect on a public route")
                }
            }
            let matchKey = "\(host ?? "*") \(prefix)"
            if let first = seenMatches[matchKey] {
                r.report(s.child("path_prefix"), r.mark(s, "path_prefix"), "routes[\(first)] already matches host \(host ?? "(any)") and path_prefix \(prefix)")
            } else { seenMatches[matchKey] = index }
            let maxBody = r.int(s, "max_body_bytes", range: 0...Int(Int64.max))
            let allowTrace = r.bool(s, "allow_trace") ?? false
            let stripPrefix = r.bool(s, "strip_prefix") ?? false
            if stripPrefix, prefix == "/" { r.warn(s.child("strip_prefix"), r.mark(s, "strip_prefix"), "has no effect with path_prefix /") }
            var upstreamHost: String? = nil
            if let v = r.string(s, "upstream_host") {
                // A Host value: a name or address, an optional port; nothing else.
                let ok = ListenAddress.parse(v) != nil || ListenAddress.parse(v + ":80") != nil
                if ok { upstreamHost = v } else { r.report(s.child("upstream_host"), r.mark(s, "upstream_host"), "'\(v)' is not a host or host:port") }
            }
            var postLogout: String? = nil
            if let v = r.string(s, "post_logout_redirect") {
                let isPath = v.hasPrefix("/") && !v.hasPrefix("//") && !v.contains("\\")
                // An absolute URL: its origin (scheme://host[:port]) must parse.
                let scheme = v.hasPrefix("https://") ? "https://" : v.hasPrefix("http://") ? "http://" : nil
                let isURL = scheme.map { Self.parseOrigin($0 + v.dropFirst($0.count).prefix { $0 != "/" && $0 != "?" }) != nil } ?? false
                if isPath || isURL, v.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f }) {
                    postLogout = v
                } else {
                    r.report(s.child("post_logout_redirect"), r.mark(s, "post_logout_redirect"), "'\(v)' is not a path (/bye) or an http(s) URL")
                }
            }
            let caFile = r.path(s, "upstream_ca_file")
            var serverName: String? = nil
            if let v = r.string(s, "upstream_server_name") {
                if Self.isHostName(v) { serverName = v }
                else { r.report(s.child("upstream_server_name"), r.mark(s, "upstream_server_name"), "'\(v)' is not a host name") }
            }
            let requireLink = r.bool(s, "require_link") ?? false
            if requireLink, auth == .public {
                r.report(s.child("require_link"), r.mark(s, "require_link"), "needs auth: required or optional (a public route knows no user)")
            }
            if requireLink, identity.linkURL == nil {
                r.report(s.child("require_link"), r.mark(s, "require_link"), "needs identity.link_url: where an unlinked user is sent")
            }
            let reuse = r.enumeration(s, "upstream_reuse", as: UpstreamReuse.self) ?? .principal
            let maxInFlight = r.int(s, "max_in_flight", range: 0...10_000_000) ?? 0
            let skipVerify = r.bool(s, "upstream_insecure_skip_verify") ?? false
            if skipVerify {
                r.warn(s.child("upstream_insecure_skip_verify"), r.mark(s, "upstream_insecure_skip_verify"),
                       "INSECURE: the upstream's certificate is not verified, so anyone on the network path can read and change this route's traffic, identity headers included; for tests only, never in production")
            }
            if let upstream, !upstream.tls {
                for key in ["upstream_ca_file", "upstream_server_name", "upstream_insecure_skip_verify"] where s.values[key] != nil {
                    r.report(s.child(key), r.mark(s, key), "applies only to an https:// upstream")
                }
            }
            if skipVerify, caFile != nil {
                r.report(s.child("upstream_insecure_skip_verify"), r.mark(s, "upstream_insecure_skip_verify"), "contradicts upstream_ca_file; keep one")
            }
            if let upstream {
                var route = Route(name: name, host: host, pathPrefix: prefix, upstream: upstream, auth: auth, allow: allow, unauthenticated: unauthenticated)
                route.maxBodyBytes = maxBody
                route.allowTrace = allowTrace
                route.stripPrefix = stripPrefix
                route.upstreamHost = upstreamHost
                route.postLogoutRedirect = postLogout
                route.upstreamCAFile = caFile
                route.upstreamServerName = serverName
                route.upstreamInsecureSkipVerify = skipVerify
                route.requireLink = requireLink
                route.upstreamReuse = reuse
                route.maxInFlight = maxInFlight
                routes.append(route)
            }
        }
    }

    private func crossCheck(_ r: ConfigReader, _ root: ConfigReader.Section) {
        let wildcard = ["0.0.0.0", "::"]
        if let redirect = server.redirectHTTPListen {
            if server.tls == nil {
                r.report("server.redirect_http_listen", root.values["server"]?.mark, "needs server.tls: it sends clients to the https listener")
            }
            for (key, other) in [("server.listen", server.listen), ("server.admin_listen", server.adminListen)]
            where redirect.port != 0 && redirect.port == other.port && (redirect.host == other.host || wildcard.contains(redirect.host) || wildcard.contains(other.host)) {
                r.report("server.redirect_http_listen", root.values["server"]?.mark, "\(redirect) is also \(key) (\(other)); give it its own port")
            }
        }
        if server.listen.port != 0, server.listen.port == server.adminListen.port,
           server.listen.host == server.adminListen.host || wildcard.contains(server.listen.host) || wildcard.contains(server.adminListen.host) {
            r.report("server.admin_listen", "\(server.adminListen) is the public listener's address (server.listen \(server.listen)); give the admin listener its own port")
        }
        guard routes.contains(where: { $0.auth != .public }) else { return }
        let which = "a route has auth 'required' or 'optional'"
        if apple == nil { r.report("apple", nil, "is required: \(which) and sign-in needs Sign in with Apple") }
        if server.publicURL == nil {
            r.report("server.public_url", root.values["server"]?.mark, "is required: \(which); Apple's redirect_uri is public_url + auth_prefix + /callback")
        }
        if session.secretFile == nil {
            if store.redisURL != nil {
                r.report("session.secret_file", root.values["session"]?.mark, "is required with store.redis_url: every instance must sign and read the same cookies")
            } else {
                r.warn("session.secret_file", root.values["session"]?.mark, "not set: a random secret is made at start, so sessions end when the gateway restarts")
            }
        }
        if session.cookieName.hasPrefix("__Host-"), let url = server.publicURL, !url.hasPrefix("https://"), !Self.isLoopbackOrigin(url) {
            r.warn("session.cookie_name", root.values["session"]?.mark,
                     "a __Host- cookie is only kept by browsers over https (or on localhost); server.public_url is \(url)")
        }
    }

    // MARK: value rules

    /// `scheme://host[:port]` with an optional trailing `/`; returns it without the slash.
    static func parseOrigin(_ text: String) -> String? {
        var t = Substring(text)
        if t.hasSuffix("/") { t = t.dropLast() }
        let scheme: String
        if t.hasPrefix("https://") { scheme = "https://" } else if t.hasPrefix("http://") { scheme = "http://" } else { return nil }
        let authority = t.dropFirst(scheme.count)
        guard !authority.isEmpty, !authority.contains(where: { "/?#@ ".contains($0) }) else { return nil }
        if ListenAddress.parse(String(authority)) == nil, ListenAddress.parse(String(authority) + ":1") == nil { return nil }
        return String(t)
    }

    /// A DNS name (letters, digits, `-`, `.`), as SNI carries it.
    static func isHostName(_ text: String) -> Bool {
        !text.isEmpty && text.count <= 253 && !text.hasPrefix(".") && !text.hasPrefix("-") && !text.contains("..")
            && text.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == ".") }
    }

    static func isLoopbackOrigin(_ origin: String) -> Bool {
        let authority = origin.split(separator: "/").last.map(String.init) ?? ""
        let address = ListenAddress.parse(authority) ?? ListenAddress.parse(authority + ":1")
        return address?.isLoopback ?? false
    }

    /// RFC 9110 token characters (header and cookie names).
    static func isToken(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || "!#$%&'*+-.^_`|~".utf8.contains(b)
        }
    }

    static func isCanonicalPrefix(_ text: String) -> Bool {
        guard text.hasPrefix("/") else { return false }
        if text == "/" { return true }
        let body = text.hasSuffix("/") ? String(text.dropFirst().dropLast()) : String(text.dropFirst())
        return body.split(separator: "/", omittingEmptySubsequences: false).allSatisfy { segment in
            !segment.isEmpty && segment != "." && segment != ".."
                && segment.utf8.allSatisfy { b in b > 0x20 && b < 0x7f && !"%?#\\;".utf8.contains(b) }
        }
    }
}

extension String {
    var replacingUnderscores: String { String(map { $0 == "_" ? "-" : $0 }) }
}

extension GatewayConfiguration.Apple {
    /// An Apple Team ID or key id: ten upper-case letters and digits.
    public static func isIdentifier(_ text: String) -> Bool {
        text.count == 10 && text.allSatisfy { $0.isASCII && ($0.isUppercase || $0.isNumber) }
    }
}
