extension GatewayConfiguration.Server {
    enum Key: String, ConfigKey {
        case listen, publicURL = "public_url", authPrefix = "auth_prefix", adminListen = "admin_listen"
        case trustedProxies = "trusted_proxies", allowedRedirectHosts = "allowed_redirect_hosts"
        case allowedOrigins = "allowed_origins", tls, accessLog = "access_log", log, timeouts, limits
        case redirectHTTPListen = "redirect_http_listen", http2Cleartext = "http2_cleartext", http2
    }

    /// Reads `server`: each key the file sets replaces its default.
    mutating func read(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let text = r.string(s, .listen) {
            if let v = ListenAddress.parse(text) { listen = v }
            else { r.report(s, .listen, "'\(text)' is not host:port (e.g. 0.0.0.0:8080 or [::]:8080)") }
        }
        if let text = r.string(s, .adminListen) {
            if let v = ListenAddress.parse(text) {
                adminListen = v
                if !v.isLoopback {
                    r.warn(s, .adminListen, "metrics and health are served on a non-loopback address; keep it off the public network")
                }
            } else { r.report(s, .adminListen, "'\(text)' is not host:port") }
        }
        if let text = r.string(s, .publicURL) {
            if let origin = GatewayConfiguration.parseOrigin(text) { publicURL = origin }
            else { r.report(s, .publicURL, "'\(text)' is not an origin like https://app.example.com (scheme and host, no path)") }
        }
        if let text = r.string(s, .authPrefix) {
            if Self.isAuthPrefix(text) { authPrefix = text }
            else { r.report(s, .authPrefix, "'\(text)' must be a path like /_auth (leading /, no trailing /, letters, digits, - _ . ~)") }
        }
        if let v = r.list(s, .trustedProxies, what: "an address or CIDR (e.g. 10.0.0.0/8)", parse: CIDR.parse) { trustedProxies = v }
        if let v = r.list(s, .allowedRedirectHosts, what: "a host name (app.example.com) or a .suffix (.example.com)", parse: Self.redirectHost) {
            allowedRedirectHosts = v
        }
        if let v = r.list(s, .allowedOrigins, what: "an origin like https://app.example.com (scheme and host, no path)", parse: GatewayConfiguration.parseOrigin) {
            allowedOrigins = v
        }
        if let t = r.section(s, .tls, keys: GatewayConfiguration.TLSFiles.Key.self) { tls = GatewayConfiguration.TLSFiles(t, r) }
        if let text = r.string(s, .redirectHTTPListen) {
            if let v = ListenAddress.parse(text) { redirectHTTPListen = v }
            else { r.report(s, .redirectHTTPListen, "'\(text)' is not host:port (e.g. 0.0.0.0:80)") }
        }
        if let v = r.enumeration(s, .accessLog, as: GatewayConfiguration.AccessLogFormat.self) { accessLog = v }
        if let l = r.section(s, .log, keys: GatewayConfiguration.Log.Key.self) { log.read(l, r) }
        if let t = r.section(s, .timeouts, keys: GatewayConfiguration.Timeouts.Key.self) { timeouts.read(t, r) }
        if let l = r.section(s, .limits, keys: GatewayConfiguration.Limits.Key.self) { limits.read(l, r) }
        if let v = r.bool(s, .http2Cleartext) { http2Cleartext = v }
        if let h = r.section(s, .http2, keys: GatewayConfiguration.HTTP2.Key.self) { http2.read(h, r) }
    }

    /// A path of segments of letters, digits, `- _ . ~` (not `.` or `..`), with a leading `/` and
    /// no trailing one.
    static func isAuthPrefix(_ text: String) -> Bool {
        let segments = text.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        return text.hasPrefix("/") && text.count > 1 && !text.hasSuffix("/")
            && segments.allSatisfy { !$0.isEmpty && $0 != "." && $0 != ".." && $0.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "-_.~".contains($0)) } }
    }

    /// A host `rd` may name, lower-cased: exact, or `.example.com` for its subdomains.
    static func redirectHost(_ text: String) -> String? {
        let host = text.lowercased()
        let name = host.hasPrefix(".") ? host.dropFirst() : Substring(host)
        return HostName.isValid(name, allowingUnderscore: false) ? host : nil
    }
}

extension GatewayConfiguration.TLSFiles {
    enum Key: String, ConfigKey {
        case certificateFile = "certificate_file", privateKeyFile = "private_key_file", alpn
    }

    /// Reads `server.tls`: both files, or nil (each missing one reported); `alpn` when set.
    init?(_ t: ConfigReader.Section<Key>, _ r: ConfigReader) {
        let certificate = r.path(t, .certificateFile, required: "the PEM certificate, leaf first, then its chain")
        let key = r.path(t, .privateKeyFile, required: "the PEM private key of the certificate")
        let alpn = Self.readALPN(t, r)
        guard let certificate, let key else { return nil }
        self.init(certificateFile: certificate, privateKeyFile: key)
        if let alpn { self.alpn = alpn }
    }

    /// `server.tls.alpn`: a non-empty list of `h2` and `http/1.1`, each at most once.
    private static func readALPN(_ t: ConfigReader.Section<Key>, _ r: ConfigReader) -> [GatewayConfiguration.ApplicationProtocol]? {
        let allowed = GatewayConfiguration.ApplicationProtocol.allCases.map { "'\($0.rawValue)'" }.joined(separator: " or ")
        guard let list = r.list(t, .alpn, what: allowed, parse: GatewayConfiguration.ApplicationProtocol.init(rawValue:)) else { return nil }
        if list.isEmpty {
            r.report(t, .alpn, "must offer at least one protocol (h2, http/1.1)")
            return nil
        }
        if Set(list).count != list.count {
            r.report(t, .alpn, "names a protocol twice")
            return nil
        }
        return list
    }
}

extension GatewayConfiguration.Log {
    enum Key: String, ConfigKey {
        case format, level
    }

    mutating func read(_ l: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.enumeration(l, .format, as: GatewayConfiguration.LogFormat.self) { format = v }
        if let v = r.enumeration(l, .level, as: GatewayConfiguration.LogLevel.self) { level = v }
    }
}

extension GatewayConfiguration.Timeouts {
    enum Key: String, ConfigKey {
        case upstreamConnect = "upstream_connect", upstreamResponse = "upstream_response", idle, shutdown, drainDelay = "drain_delay"
        case requestBody = "request_body", tlsHandshake = "tls_handshake", requestHead = "request_head"
    }

    mutating func read(_ t: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.duration(t, .requestBody) { requestBody = v }
        if let v = r.duration(t, .requestHead) { requestHead = v }
        if let v = r.duration(t, .tlsHandshake) { tlsHandshake = v }
        if let v = r.duration(t, .upstreamConnect) { upstreamConnect = v }
        if let v = r.duration(t, .upstreamResponse) { upstreamResponse = v }
        if let v = r.duration(t, .idle) { idle = v }
        if let v = r.duration(t, .shutdown, atLeast: .zero) { shutdown = v }
        if let v = r.duration(t, .drainDelay, atLeast: .zero) { drainDelay = v }
    }
}

extension GatewayConfiguration.Limits {
    enum Key: String, ConfigKey {
        case maxHeaderBytes = "max_header_bytes", maxHeaderCount = "max_header_count", maxBodyBytes = "max_body_bytes"
        case maxConnections = "max_connections", maxConnectionsPerClient = "max_connections_per_client"
        case maxIdleUpstreamConnections = "max_idle_upstream_connections"
    }

    mutating func read(_ l: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.int(l, .maxConnections, range: 0...10_000_000) { maxConnections = v }
        if let v = r.int(l, .maxConnectionsPerClient, range: 0...10_000_000) { maxConnectionsPerClient = v }
        if let v = r.int(l, .maxIdleUpstreamConnections, range: 0...1_000_000) { maxIdleUpstreamConnections = v }
        if let v = r.int(l, .maxBodyBytes, range: 0...Int(Int64.max)) { maxBodyBytes = v }
        if let v = r.int(l, .maxHeaderBytes, range: 1024...(1 << 20)) { maxHeaderBytes = v }
        if let v = r.int(l, .maxHeaderCount, range: 8...1000) { maxHeaderCount = v }
    }
}

extension GatewayConfiguration.HTTP2 {
    enum Key: String, ConfigKey {
        case maxConcurrentStreams = "max_concurrent_streams", maxHeaderListSize = "max_header_list_size"
        case maxStreamResets = "max_stream_resets"
    }

    mutating func read(_ h: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.int(h, .maxConcurrentStreams, range: 1...1000) { maxConcurrentStreams = v }
        if let v = r.int(h, .maxHeaderListSize, range: 1024...(1 << 20)) { maxHeaderListSize = v }
        if let v = r.int(h, .maxStreamResets, range: 1...100_000) { maxStreamResets = v }
    }
}
