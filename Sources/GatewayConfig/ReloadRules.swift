/// What a reload (SIGHUP) may change. A reload swaps the whole running configuration as one
/// value or nothing: a file that changes any key listed here is refused as a whole, each such key
/// named, and the running configuration stays. Every other key reloads.
///
/// The keys here are bound to what the process holds open or has already handed out: sockets
/// and their per-connection limits, the store and its key space, the session cookie's name and
/// signing secret (changing them signs everyone out), the Apple client and its credentials, the
/// identity-assertion key, the log sinks, whether the listener speaks TLS. The listener's
/// certificate and key files are re-read on every reload; their paths may change too.
public enum ReloadRules {
    public struct Key: Sendable {
        public let path: String
        /// Why it is restart-only, when the refusal should say more than that it is.
        let reason: String?
        let differs: @Sendable (GatewayConfiguration, GatewayConfiguration) -> Bool

        static func on<T: Equatable & Sendable>(_ path: String, because reason: String? = nil, _ value: @escaping @Sendable (GatewayConfiguration) -> T) -> Key {
            Key(path: path, reason: reason) { value($0) != value($1) }
        }
    }

    /// Why the keys that make Apple's return URL are restart-only (issue 28 §1): a reload that
    /// moved it would log "reloaded" while every new sign-in failed at Apple with
    /// `invalid_request`.
    static let returnURL = "it moves the return URL registered at Apple (server.public_url + server.auth_prefix + /callback): "
        + "register the new URL with the Services ID first, then restart"

    /// The keys that apply only at start, in file order.
    public static let restartOnly: [Key] = [
        .on("server.listen") { $0.server.listen },
        .on("server.public_url", because: returnURL) { $0.server.publicURL },
        .on("server.auth_prefix", because: returnURL) { $0.server.authPrefix },
        .on("server.admin_listen") { $0.server.adminListen },
        .on("server.redirect_http_listen") { $0.server.redirectHTTPListen },
        .on("server.tls") { $0.server.tls == nil },
        .on("server.tls.alpn") { $0.server.tls?.alpn ?? GatewayConfiguration.TLSFiles.defaultALPN },
        .on("server.http2_cleartext") { $0.server.http2Cleartext },
        .on("server.http2.max_concurrent_streams") { $0.server.http2.maxConcurrentStreams },
        .on("server.http2.max_header_list_size") { $0.server.http2.maxHeaderListSize },
        .on("server.http2.max_stream_resets") { $0.server.http2.maxStreamResets },
        .on("server.access_log") { $0.server.accessLog },
        .on("server.log.format") { $0.server.log.format },
        .on("server.log.level") { $0.server.log.level },
        .on("server.timeouts.upstream_connect") { $0.server.timeouts.upstreamConnect },
        .on("server.timeouts.upstream_response") { $0.server.timeouts.upstreamResponse },
        .on("server.timeouts.idle") { $0.server.timeouts.idle },
        .on("server.timeouts.request_body") { $0.server.timeouts.requestBody },
        .on("server.timeouts.tls_handshake") { $0.server.timeouts.tlsHandshake },
        .on("server.timeouts.request_head") { $0.server.timeouts.requestHead },
        .on("server.limits.max_header_bytes") { $0.server.limits.maxHeaderBytes },
        .on("server.limits.max_connections") { $0.server.limits.maxConnections },
        .on("server.limits.max_connections_per_client") { $0.server.limits.maxConnectionsPerClient },
        .on("server.limits.max_header_count") { $0.server.limits.maxHeaderCount },
        .on("server.limits.max_idle_upstream_connections") { $0.server.limits.maxIdleUpstreamConnections },
        .on("apple") { $0.apple == nil },
        .on("apple.team_id") { $0.apple?.teamID },
        .on("apple.client_ids") { $0.apple?.clientIDs },
        .on("apple.app_groups") { $0.apple?.appGroups },
        .on("apple.key_id") { $0.apple?.keyID },
        .on("apple.private_key_file") { $0.apple?.privateKeyFile },
        .on("apple.base_url") { $0.apple?.baseURL },
        .on("apple.revalidate_after") { $0.apple?.revalidateAfter },
        .on("apple.revalidate_grace") { $0.apple?.revalidateGrace },
        .on("apple.outage_grace") { $0.apple?.outageGrace },
        .on("apple.timeout") { $0.apple?.timeout },
        .on("apple.clock_skew") { $0.apple?.clockSkew },
        .on("events") { $0.events },
        .on("identity.links.secret_file") { $0.identity.linksSecretFile },
        .on("identity.link_lookup_url") { $0.identity.linkLookupURL },
        .on("session.cookie_name") { $0.session.cookieName },
        .on("session.cookie_domain") { $0.session.cookieDomain },
        .on("session.secret_file") { $0.session.secretFile },
        .on("store.redis_url") { $0.store.redisURL },
        .on("store.key_prefix") { $0.store.keyPrefix },
        .on("store.timeout") { $0.store.timeout },
        .on("store.local_cache_ttl") { $0.store.localCacheTTL },
        .on("store.local_cache_entries") { $0.store.localCacheEntries },
        .on("store.state_dir") { $0.store.stateDir },
        .on("store.tls.ca_file") { $0.store.tls.caFile },
        .on("store.tls.certificate_file") { $0.store.tls.certificateFile },
        .on("store.tls.private_key_file") { $0.store.tls.privateKeyFile },
        .on("store.tls.server_name") { $0.store.tls.serverName },
        .on("store.sentinel") { $0.store.sentinel == nil },
        .on("store.sentinel.master_name") { $0.store.sentinel?.masterName },
        .on("store.sentinel.addresses") { $0.store.sentinel?.addresses },
        .on("store.sentinel.password") { $0.store.sentinel?.password },
        .on("store.cluster") { $0.store.cluster == nil },
        .on("store.cluster.addresses") { $0.store.cluster?.addresses },
        .on("tracing") { $0.tracing == nil },
        .on("tracing.endpoint") { $0.tracing?.endpoint },
        .on("tracing.protocol") { $0.tracing?.exportProtocol.rawValue },
        .on("tracing.headers") { $0.tracing?.headers },
        .on("tracing.include_user") { $0.tracing?.includeUser },
        .on("tracing.service_name") { $0.tracing?.serviceName },
        .on("tracing.timeout") { $0.tracing?.timeout },
        .on("tracing.max_queue") { $0.tracing?.maxQueue },
        .on("identity.assertion.enabled") { $0.identity.assertion.enabled },
        .on("identity.assertion.key_file") { $0.identity.assertion.keyFile },
    ]

    /// The restart-only keys whose value differs between the running configuration and the file.
    public static func changed(running: GatewayConfiguration, next: GatewayConfiguration) -> [String] {
        restartOnly.filter { $0.differs(running, next) }.map(\.path)
    }

    /// One error per restart-only key the file changes, located at the key (or, when the file
    /// no longer sets it, at the nearest enclosing key it has). Values are not repeated: a Redis
    /// URL carries a password.
    public static func refusal(running: GatewayConfiguration, next: GatewayConfiguration, locations: [String: ConfigLocation]) -> [ConfigProblem] {
        restartOnly.filter { $0.differs(running, next) }.map { key in
            let location = ConfigLocation.nearest(key.path, in: locations)
            return ConfigProblem(.error, path: key.path, line: location?.line, column: location?.column,
                                 message: "changes only at restart; the reload is refused and the running configuration stays" + (key.reason.map { ": " + $0 } ?? ""))
        }
    }
}
