import Testing

@testable import GatewayConfig

/// Which edits a reload applies and which refuse it, and where the refusal points.
@Suite("Reload rules")
struct ReloadRulesTests {
    static let base = """
        server:
          listen: "0.0.0.0:8080"
          admin_listen: "127.0.0.1:9091"
          public_url: "https://app.example.com"
          auth_prefix: "/_auth"
          trusted_proxies: []
          allowed_redirect_hosts: []
          allowed_origins: []
          access_log: text
          redirect_http_listen: "0.0.0.0:80"
          tls: { certificate_file: "/etc/sessiongate/cert.pem", private_key_file: "/etc/sessiongate/key.pem", alpn: ["h2", "http/1.1"] }
          http2:
            max_concurrent_streams: 100
            max_header_list_size: 16384
            max_stream_resets: 200
          timeouts:
            upstream_connect: 5s
            upstream_response: 60s
            idle: 60s
            shutdown: 30s
            request_body: 60s
            tls_handshake: 10s
          limits:
            max_header_bytes: 16384
            max_header_count: 100
            max_body_bytes: 0
        apple:
          team_id: "ABCDE12345"
          client_ids: ["com.example.web"]
          key_id: "KEY1234567"
          private_key_file: "/etc/sessiongate/AuthKey.p8"
          base_url: "https://appleid.apple.com"
          scopes: ["name", "email"]
          revalidate_after: 24h
          revalidate_grace: 1h
          outage_grace: 72h
          timeout: 5s
          exchanges_per_minute: 30
          logins_per_minute: 60
          max_pending_logins: 10000
        session:
          cookie_name: "__Host-sessiongate"
          secret_file: "/etc/sessiongate/session.key"
          idle_timeout: 12h
          absolute_timeout: 30d
        store:
          redis_url: "rediss://127.0.0.1:6379/0"
          key_prefix: "sg:"
          timeout: 250ms
          local_cache_ttl: 5s
          tls: { ca_file: "/etc/sessiongate/redis-ca.pem", server_name: "redis.internal" }
          sentinel: { master_name: "mymaster", addresses: ["10.0.0.1:26379"] }
        identity:
          header_prefix: "X-Auth-"
          strip_headers: []
          assertion:
            enabled: true
            key_file: "/etc/sessiongate/assertion.pem"
            ttl: 60s
          headers:
            user: "X-Auth-User"
        tracing:
          endpoint: "http://otel-collector:4318/v1/traces"
          sample_ratio: 0.1
          headers: { x-api-key: "k1" }
          include_user: false
          max_queue: 4096
        routes:
          - name: app
            upstream: "http://127.0.0.1:9000"
            allow:
              users: []
          - name: secure
            path_prefix: /s/
            upstream: "https://app.internal:8443"
            upstream_ca_file: "/etc/sessiongate/internal-ca.pem"
        """

    static func load(_ yaml: String) throws -> GatewayConfiguration.LoadResult {
        let result = GatewayConfiguration.parse(yaml: yaml)
        #expect(result.errors == [], "\(result.errors)")
        return result
    }

    @Test("each restart-only key refuses the reload, named alone", arguments: [
        ("server.listen", #"listen: "0.0.0.0:8080""#, #"listen: "0.0.0.0:8081""#),
        ("server.admin_listen", #"admin_listen: "127.0.0.1:9091""#, #"admin_listen: "127.0.0.1:9092""#),
        ("server.access_log", "access_log: text", "access_log: json"),
        ("server.timeouts.upstream_connect", "upstream_connect: 5s", "upstream_connect: 6s"),
        ("server.timeouts.upstream_response", "upstream_response: 60s", "upstream_response: 61s"),
        ("server.timeouts.idle", "    idle: 60s", "    idle: 61s"),
        ("server.timeouts.request_body", "request_body: 60s", "request_body: 61s"),
        ("server.limits.max_header_bytes", "max_header_bytes: 16384", "max_header_bytes: 8192"),
        ("server.limits.max_header_count", "max_header_count: 100", "max_header_count: 50"),
        ("apple.team_id", #"team_id: "ABCDE12345""#, #"team_id: "ABCDE12346""#),
        ("apple.client_ids", #"client_ids: ["com.example.web"]"#, #"client_ids: ["com.example.web", "com.example.app"]"#),
        ("apple.key_id", #"key_id: "KEY1234567""#, #"key_id: "KEY1234568""#),
        ("apple.private_key_file", "AuthKey.p8", "AuthKey2.p8"),
        ("apple.base_url", #"base_url: "https://appleid.apple.com""#, #"base_url: "https://apple.example.com""#),
        ("apple.revalidate_after", "revalidate_after: 24h", "revalidate_after: 48h"),
        ("apple.revalidate_grace", "revalidate_grace: 1h", "revalidate_grace: 2h"),
        ("apple.outage_grace", "outage_grace: 72h", "outage_grace: 24h"),
        ("apple.timeout", "  timeout: 5s", "  timeout: 3s"),
        ("session.cookie_name", #"cookie_name: "__Host-sessiongate""#, #"cookie_name: "__Host-other""#),
        ("session.secret_file", "session.key", "session2.key"),
        ("store.redis_url", "6379/0", "6379/1"),
        ("store.key_prefix", #"key_prefix: "sg:""#, #"key_prefix: "sg2:""#),
        ("store.timeout", "timeout: 250ms", "timeout: 300ms"),
        ("store.local_cache_ttl", "local_cache_ttl: 5s", "local_cache_ttl: 1s"),
        ("identity.assertion.enabled", "enabled: true", "enabled: false"),
        ("identity.assertion.key_file", "assertion.pem", "assertion2.pem"),
        ("server.redirect_http_listen", #"redirect_http_listen: "0.0.0.0:80""#, #"redirect_http_listen: "0.0.0.0:81""#),
        ("server.timeouts.tls_handshake", "tls_handshake: 10s", "tls_handshake: 5s"),
        ("server.tls.alpn", #"alpn: ["h2", "http/1.1"]"#, #"alpn: ["http/1.1"]"#),
        ("server.http2.max_concurrent_streams", "max_concurrent_streams: 100", "max_concurrent_streams: 10"),
        ("server.http2.max_header_list_size", "max_header_list_size: 16384", "max_header_list_size: 8192"),
        ("server.http2.max_stream_resets", "max_stream_resets: 200", "max_stream_resets: 100"),
        ("store.tls.ca_file", "redis-ca.pem", "redis-ca2.pem"),
        ("store.tls.server_name", #"server_name: "redis.internal""#, #"server_name: "redis2.internal""#),
        ("store.sentinel.master_name", #"master_name: "mymaster""#, #"master_name: "other""#),
        ("store.sentinel.addresses", #"addresses: ["10.0.0.1:26379"]"#, #"addresses: ["10.0.0.2:26379"]"#),
        ("server.public_url", #"public_url: "https://app.example.com""#, #"public_url: "https://new.example.com""#),
        ("server.auth_prefix", #"auth_prefix: "/_auth""#, #"auth_prefix: "/auth2""#),
        ("tracing.endpoint", "otel-collector:4318", "otel-collector-2:4318"),
        ("tracing.headers", #"x-api-key: "k1""#, #"x-api-key: "k2""#),
        ("tracing.include_user", "include_user: false", "include_user: true"),
        ("tracing.max_queue", "max_queue: 4096", "max_queue: 100"),
    ])
    func restartOnly(key: String, from: String, to: String) throws {
        #expect(Self.base.contains(from), "the case edits the base")
        let running = try #require(try Self.load(Self.base).configuration)
        let edited = Self.base.replacingOccurrences(of: from, with: to)
        let next = try Self.load(edited)
        let refusal = ReloadRules.refusal(running: running, next: try #require(next.configuration), locations: next.locations)
        #expect(refusal.map(\.path) == [key])
        // Located at the key itself, on the line the edit is on.
        let line = edited.split(separator: "\n", omittingEmptySubsequences: false).firstIndex { $0.contains(to) }.map { $0 + 1 }
        #expect(refusal.first?.line == line)
        #expect(refusal.first?.description.contains("error: \(key): changes only at restart") == true)
    }

    @Test("every other key reloads", arguments: [
        "trusted_proxies: []": #"trusted_proxies: ["10.0.0.0/8"]"#,
        "allowed_redirect_hosts: []": #"allowed_redirect_hosts: [".example.com"]"#,
        "allowed_origins: []": #"allowed_origins: ["https://other.example.com"]"#,
        "shutdown: 30s": "shutdown: 5s",
        "max_body_bytes: 0": "max_body_bytes: 10",
        #"scopes: ["name", "email"]"#: #"scopes: ["email"]"#,
        "idle_timeout: 12h": "idle_timeout: 1h",
        "exchanges_per_minute: 30": "exchanges_per_minute: 10",
        "logins_per_minute: 60": "logins_per_minute: 20",
        "max_pending_logins: 10000": "max_pending_logins: 50000",
        "absolute_timeout: 30d": "absolute_timeout: 7d",
        #"header_prefix: "X-Auth-""#: #"header_prefix: "X-Gw-""#,
        "strip_headers: []": #"strip_headers: ["X-Legacy-User"]"#,
        "ttl: 60s": "ttl: 120s",
        #"user: "X-Auth-User""#: #"user: "X-User""#,
        "users: []": #"users: ["someone"]"#,
        "upstream: \"http://127.0.0.1:9000\"": "upstream: \"http://127.0.0.1:9001\"",
        "/etc/sessiongate/cert.pem": "/etc/letsencrypt/live/app/fullchain.pem",
        "/etc/sessiongate/key.pem": "/etc/letsencrypt/live/app/privkey.pem",
        "internal-ca.pem": "internal-ca-2.pem",
        "https://app.internal:8443": "https://app2.internal:8443",
        "sample_ratio: 0.1": "sample_ratio: 0.5",
    ])
    func reloadable(from: String, to: String) throws {
        #expect(Self.base.contains(from))
        let running = try #require(try Self.load(Self.base).configuration)
        let next = try #require(try Self.load(Self.base.replacingOccurrences(of: from, with: to)).configuration)
        #expect(next != running, "the edit changes the configuration")
        #expect(ReloadRules.changed(running: running, next: next) == [])
    }

    @Test("turning h2c on or off on a plain listener applies only at restart")
    func cleartextHTTP2() throws {
        let plain = "server:\n  http2_cleartext: false\nroutes:\n  - name: a\n    upstream: \"http://127.0.0.1:1\"\n    auth: public\n"
        let running = try #require(try Self.load(plain).configuration)
        let next = try Self.load(plain.replacingOccurrences(of: "http2_cleartext: false", with: "http2_cleartext: true"))
        let refusal = ReloadRules.refusal(running: running, next: try #require(next.configuration), locations: next.locations)
        #expect(refusal.map(\.path) == ["server.http2_cleartext"])
        #expect(refusal.first?.line == 2)
    }

    @Test("a key the new file no longer sets is located at its nearest enclosing key; removing apple names apple")
    func removedKeys() throws {
        let running = try #require(try Self.load(Self.base).configuration)
        let withoutTimeout = Self.base.replacingOccurrences(of: "    upstream_connect: 5s\n", with: "    upstream_connect: 6s\n")
            .replacingOccurrences(of: "    idle: 60s\n", with: "")
        let next = try Self.load(withoutTimeout)
        let refusal = ReloadRules.refusal(running: running, next: try #require(next.configuration), locations: next.locations)
        #expect(refusal.map(\.path) == ["server.timeouts.upstream_connect"], "idle's default is its old value: unchanged")
        // Running on 9000; the new file drops the key, so the default (8080) would apply.
        let elsewhere = try #require(try Self.load(Self.base.replacingOccurrences(of: "0.0.0.0:8080", with: "0.0.0.0:9000")).configuration)
        let moved = try Self.load(Self.base.replacingOccurrences(of: "  listen: \"0.0.0.0:8080\"\n", with: ""))
        let listenRefusal = ReloadRules.refusal(running: elsewhere, next: try #require(moved.configuration), locations: moved.locations)
        #expect(listenRefusal.map(\.path) == ["server.listen"])
        #expect(listenRefusal.first?.line == 1, "at server:")

        var noApple = running
        noApple.apple = nil
        #expect(ReloadRules.changed(running: running, next: noApple).first == "apple")
    }
}
