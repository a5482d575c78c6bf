import Foundation
import Testing

@testable import GatewayConfig

/// The repository root, for the shipped example configurations.
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

@Suite("Configuration loading")
struct ConfigLoadingTests {
    static let minimal = """
        routes:
          - name: app
            upstream: "http://127.0.0.1:9000"
            auth: public
        """

    @Test("the shipped configurations are valid", arguments: ["conf/sessiongate.yaml", "conf/demo.yaml"])
    func shippedConfigurations(path: String) throws {
        let result = GatewayConfiguration.load(file: "\(repositoryRoot)/\(path)")
        #expect(result.errors == [], "\(result.errors)")
        #expect(result.configuration != nil)
    }

    @Test("the annotated example sets every key to its documented default")
    func annotatedDefaults() throws {
        let config = try #require(GatewayConfiguration.load(file: "\(repositoryRoot)/conf/sessiongate.yaml").configuration)
        var defaults = GatewayConfiguration()
        #expect(config.server.timeouts == defaults.server.timeouts)
        #expect(config.server.limits == defaults.server.limits)
        #expect(config.server.http2 == defaults.server.http2)
        #expect(config.server.http2Cleartext == defaults.server.http2Cleartext)
        #expect(config.server.log == defaults.server.log)
        #expect(config.server.authPrefix == defaults.server.authPrefix)
        #expect(config.server.adminListen == defaults.server.adminListen)
        #expect(config.session.idleTimeout == defaults.session.idleTimeout)
        #expect(config.session.absoluteTimeout == defaults.session.absoluteTimeout)
        #expect(config.store.timeout == defaults.store.timeout)
        #expect(config.store.localCacheTTL == defaults.store.localCacheTTL)
        #expect(config.identity.headers == defaults.identity.headers)
        #expect(config.identity.headerPrefix == defaults.identity.headerPrefix)
        #expect(config.identity.stripHeaders == defaults.identity.stripHeaders)
        defaults.apple = GatewayConfiguration.Apple()
        #expect(config.apple?.revalidateAfter == defaults.apple?.revalidateAfter)
        #expect(config.apple?.outageGrace == defaults.apple?.outageGrace)
        #expect(config.apple?.baseURL == defaults.apple?.baseURL)
        #expect(config.apple?.exchangesPerMinute == defaults.apple?.exchangesPerMinute)
        #expect(config.apple?.loginsPerMinute == defaults.apple?.loginsPerMinute)
        #expect(config.apple?.maxPendingLogins == defaults.apple?.maxPendingLogins)
    }

    @Test("a minimal file takes every default")
    func minimalFile() throws {
        let config = try #require(GatewayConfiguration.parse(yaml: Self.minimal).configuration)
        #expect(config.server.listen == ListenAddress(host: "0.0.0.0", port: 8080))
        #expect(config.routes.count == 1)
        #expect(config.routes[0].auth == .public)  // minimal says so; the default is checked below
        #expect(config.routes[0].pathPrefix == "/")
        #expect(config.routes[0].upstream == UpstreamURL(host: "127.0.0.1", port: 9000))
        #expect(config.apple == nil)
        #expect(config.store.redisURL == nil)
    }

    struct BadCase: CustomTestStringConvertible, Sendable {
        let name: String
        let yaml: String
        let path: String
        let line: Int?
        let column: Int?
        let message: String
        var testDescription: String { name }
    }

    static let badCases: [BadCase] = [
        BadCase(name: "tracing: an endpoint that is not a URL", yaml: "tracing:\n  endpoint: \"collector:4318\"\n" + minimal, path: "tracing.endpoint",
                line: 2, column: 13, message: "not an http:// or https:// URL"),
        BadCase(name: "tracing: a ratio over 1", yaml: "tracing:\n  sample_ratio: 1.5\n" + minimal, path: "tracing.sample_ratio", line: 2, column: 17,
                message: "not a number from 0 to 1"),
        BadCase(name: "tracing: an unknown protocol", yaml: "tracing:\n  protocol: zipkin\n" + minimal, path: "tracing.protocol", line: 2, column: 13,
                message: "http/protobuf | grpc"),
        BadCase(name: "tracing: a header name with a space", yaml: "tracing:\n  headers: { \"api key\": x }\n" + minimal, path: "tracing.headers",
                line: 2, column: 14, message: "not a header name"),
        BadCase(name: "misspelled key", yaml: "server:\n  lisen: \"0.0.0.0:80\"\n" + minimal, path: "server.lisen", line: 2, column: 3, message: "did you mean 'listen'"),
        BadCase(name: "unknown top-level key", yaml: "servers: {}\n" + minimal, path: "servers", line: 1, column: 1, message: "did you mean 'server'"),
        BadCase(name: "wrong type: mapping expected", yaml: "server: 8080\n" + minimal, path: "server", line: 1, column: 9, message: "expected a mapping"),
        BadCase(name: "wrong type: list expected", yaml: "server:\n  trusted_proxies: \"10.0.0.0/8\"\n" + minimal, path: "server.trusted_proxies", line: 2, column: 20, message: "expected a list"),
        BadCase(name: "wrong type: number expected", yaml: "server:\n  limits:\n    max_header_count: many\n" + minimal, path: "server.limits.max_header_count", line: 3, column: 23, message: "whole number"),
        BadCase(name: "bad duration", yaml: "store:\n  timeout: \"5 seconds\"\n" + minimal, path: "store.timeout", line: 2, column: 12, message: "not a duration"),
        BadCase(name: "a cache without room", yaml: "store:\n  local_cache_entries: 0\n" + minimal, path: "store.local_cache_entries", line: 2, column: 24, message: "must be between 1 and"),
        BadCase(name: "negative duration", yaml: "store:\n  timeout: \"-5s\"\n" + minimal, path: "store.timeout", line: 2, column: 12, message: "not a duration"),
        BadCase(name: "bad CIDR", yaml: "server:\n  trusted_proxies: [\"10.0.0.0/33\"]\n" + minimal, path: "server.trusted_proxies[0]", line: 2, column: 21, message: "CIDR"),
        BadCase(name: "bad listen address", yaml: "server:\n  listen: \"8080\"\n" + minimal, path: "server.listen", line: 2, column: 11, message: "host:port"),
        BadCase(name: "bad upstream scheme", yaml: "routes:\n  - name: a\n    upstream: \"ftp://x:1\"\n", path: "routes[0].upstream", line: 3, column: 15, message: "http://host:port or https://host:port"),
        BadCase(name: "upstream with a path", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1/base\"\n", path: "routes[0].upstream", line: 3, column: 15, message: "without path"),
        BadCase(name: "route without upstream", yaml: "routes:\n  - name: a\n    path_prefix: /x\n", path: "routes[0].upstream", line: 2, column: 5, message: "is required"),
        BadCase(name: "route without name", yaml: "routes:\n  - upstream: \"http://x:1\"\n", path: "routes[0].name", line: 2, column: 5, message: "is required"),
        BadCase(name: "overlapping identical routes", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n  - name: b\n    upstream: \"http://y:1\"\n", path: "routes[1].path_prefix", line: 4, column: 5, message: "routes[0] already matches"),
        BadCase(name: "duplicate route name", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n  - name: a\n    path_prefix: /b\n    upstream: \"http://y:1\"\n", path: "routes[1].name", line: 4, column: 11, message: "already the name"),
        BadCase(name: "non-canonical path prefix", yaml: "routes:\n  - name: a\n    path_prefix: \"/a/../b\"\n    upstream: \"http://x:1\"\n", path: "routes[0].path_prefix", line: 3, column: 18, message: "canonical"),
        BadCase(name: "bad auth mode", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n    auth: maybe\n", path: "routes[0].auth", line: 4, column: 11, message: "required | optional | public"),
        BadCase(name: "no routes", yaml: "server: {}\n", path: "routes", line: nil, column: nil, message: "at least one route"),
        BadCase(name: "inline secret", yaml: "session:\n  secret_file: \"env:1BAD\"\n" + minimal, path: "session.secret_file", line: 2, column: 16, message: "env:NAME"),
        BadCase(name: "bad redis URL", yaml: "store:\n  redis_url: \"http://x\"\n" + minimal, path: "store.redis_url", line: 2, column: 14, message: "redis URL"),
        BadCase(name: "apple without required keys", yaml: "apple:\n  scopes: [name]\n" + minimal, path: "apple.team_id", line: 2, column: 3, message: "is required"),
        BadCase(name: "bad team id", yaml: "apple:\n  team_id: abc\n  key_id: KEY1234567\n  client_ids: [a.b]\n  private_key_file: /k.p8\n" + minimal, path: "apple.team_id", line: 2, column: 12, message: "Team ID"),
        BadCase(name: "bad apple scope", yaml: "apple:\n  team_id: ABCDE12345\n  key_id: KEY1234567\n  client_ids: [a.b]\n  private_key_file: /k.p8\n  scopes: [phone]\n" + minimal, path: "apple.scopes[0]", line: 6, column: 12, message: "scope"),
        BadCase(name: "negative logins per minute", yaml: "apple:\n  team_id: ABCDE12345\n  key_id: KEY1234567\n  client_ids: [a.b]\n  private_key_file: /k.p8\n  logins_per_minute: -1\n" + minimal, path: "apple.logins_per_minute", line: 6, column: 22, message: "must be between 0 and"),
        BadCase(name: "pending logins not a number", yaml: "apple:\n  team_id: ABCDE12345\n  key_id: KEY1234567\n  client_ids: [a.b]\n  private_key_file: /k.p8\n  max_pending_logins: lots\n" + minimal, path: "apple.max_pending_logins", line: 6, column: 23, message: "whole number"),
        BadCase(name: "idle longer than absolute", yaml: "session:\n  idle_timeout: 40d\n" + minimal, path: "session.idle_timeout", line: 2, column: 17, message: "longer than"),
        BadCase(name: "duplicate key", yaml: "server:\n  listen: \"0.0.0.0:1\"\n  listen: \"0.0.0.0:2\"\n" + minimal, path: "", line: nil, column: nil, message: "duplicate key 'listen'"),
        BadCase(name: "YAML syntax error", yaml: "server:\n  listen: [\n", path: "", line: 3, column: 1, message: "YAML syntax"),
        BadCase(name: "identity headers that collide", yaml: "identity:\n  headers:\n    email: X_Auth_User\n" + minimal, path: "identity.headers", line: 3, column: 5, message: "same name"),
        BadCase(name: "strip_headers naming no header", yaml: "identity:\n  strip_headers: [X-Legacy-User, \"X Legacy\"]\n" + minimal, path: "identity.strip_headers[1]", line: 2, column: 34, message: "not a header name"),
        BadCase(name: "strip_headers with an empty name", yaml: "identity:\n  strip_headers: [\"\"]\n" + minimal, path: "identity.strip_headers[0]", line: 2, column: 19, message: "not a header name"),
        BadCase(name: "strip_headers not a list", yaml: "identity:\n  strip_headers: X-Legacy-User\n" + minimal, path: "identity.strip_headers", line: 2, column: 18, message: "expected a list"),
        BadCase(name: "TLS without its key", yaml: "server:\n  tls: { certificate_file: a }\n" + minimal, path: "server.tls.private_key_file", line: 2, column: 8, message: "is required"),
        BadCase(name: "redirect listener without TLS", yaml: "server:\n  redirect_http_listen: \"0.0.0.0:80\"\n" + minimal, path: "server.redirect_http_listen", line: 2, column: 3, message: "needs server.tls"),
        BadCase(name: "redirect listener on the public port", yaml: "server:\n  listen: \"0.0.0.0:8443\"\n  tls: { certificate_file: a, private_key_file: b }\n  redirect_http_listen: \"127.0.0.1:8443\"\n" + minimal, path: "server.redirect_http_listen", line: 2, column: 3, message: "is also server.listen"),
        BadCase(name: "store.tls without rediss://", yaml: "store:\n  redis_url: \"redis://r:6379\"\n  tls: { ca_file: /ca.pem }\n" + minimal, path: "store.tls", line: 3, column: 8, message: "rediss://"),
        BadCase(name: "client certificate without its key", yaml: "store:\n  redis_url: \"rediss://r:6380\"\n  tls: { certificate_file: /c.pem }\n" + minimal, path: "store.tls.private_key_file", line: 3, column: 8, message: "a client certificate needs its key"),
        BadCase(name: "bad SNI name", yaml: "store:\n  redis_url: \"rediss://r:6380\"\n  tls: { server_name: \"a b\" }\n" + minimal, path: "store.tls.server_name", line: 3, column: 23, message: "not a host name"),
        BadCase(name: "sentinel without addresses", yaml: "store:\n  redis_url: \"redis://mymaster/0\"\n  sentinel: { master_name: mymaster }\n" + minimal, path: "store.sentinel.addresses", line: 3, column: 13, message: "at least one sentinel"),
        BadCase(name: "sentinel without redis_url", yaml: "store:\n  sentinel: { master_name: m, addresses: [\"10.0.0.1:26379\"] }\n" + minimal, path: "store.redis_url", line: 2, column: 3, message: "is required with store.sentinel"),
        BadCase(name: "cluster without redis_url", yaml: "store:\n  cluster: { addresses: [\"10.0.0.1:6379\"] }\n" + minimal, path: "store.redis_url", line: 2, column: 3, message: "is required with store.cluster"),
        BadCase(name: "cluster on a database other than 0", yaml: "store:\n  redis_url: \"redis://c/2\"\n  cluster: { addresses: [\"10.0.0.1:6379\"] }\n" + minimal, path: "store.redis_url", line: 2, column: 14, message: "only database 0"),
        BadCase(name: "cluster without nodes", yaml: "store:\n  redis_url: \"redis://c/0\"\n  cluster: { addresses: [] }\n" + minimal, path: "store.cluster.addresses", line: 3, column: 25, message: "at least one node"),
        BadCase(name: "cluster and sentinel", yaml: "store:\n  redis_url: \"redis://c/0\"\n  sentinel: { master_name: m, addresses: [\"10.0.0.1:26379\"] }\n  cluster: { addresses: [\"10.0.0.1:6379\"] }\n" + minimal, path: "store.cluster", line: 4, column: 12, message: "exclude each other"),
        BadCase(name: "bad sentinel address", yaml: "store:\n  redis_url: \"redis://m/0\"\n  sentinel: { master_name: m, addresses: [\"10.0.0.1\"] }\n" + minimal, path: "store.sentinel.addresses[0]", line: 3, column: 43, message: "host:port of a sentinel"),
        BadCase(name: "CA file for an http:// upstream", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n    upstream_ca_file: /ca.pem\n", path: "routes[0].upstream_ca_file", line: 4, column: 23, message: "only to an https:// upstream"),
        BadCase(name: "skip-verify beside a CA file", yaml: "routes:\n  - name: a\n    upstream: \"https://x\"\n    upstream_ca_file: /ca.pem\n    upstream_insecure_skip_verify: true\n", path: "routes[0].upstream_insecure_skip_verify", line: 5, column: 36, message: "contradicts"),
        BadCase(name: "bad upstream_reuse", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n    upstream_reuse: pooled\n", path: "routes[0].upstream_reuse", line: 4, column: 21, message: "principal | shared | echo | none"),
        BadCase(name: "negative upstream_max_connections", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n    upstream_max_connections: -1\n", path: "routes[0].upstream_max_connections", line: 4, column: 31, message: "must be between 0 and"),
        BadCase(name: "idle upstream connections not a number", yaml: "server:\n  limits:\n    max_idle_upstream_connections: many\n" + minimal, path: "server.limits.max_idle_upstream_connections", line: 3, column: 36, message: "expected a whole number"),
        BadCase(name: "negative max_in_flight", yaml: "routes:\n  - name: a\n    upstream: \"http://x:1\"\n    max_in_flight: -1\n", path: "routes[0].max_in_flight", line: 4, column: 20, message: "must be between 0 and"),
        BadCase(name: "negative connection cap", yaml: "server:\n  limits:\n    max_connections_per_client: -5\n" + minimal, path: "server.limits.max_connections_per_client", line: 3, column: 33, message: "must be between 0 and"),
        BadCase(name: "bad request_head", yaml: "server:\n  timeouts:\n    request_head: soon\n" + minimal, path: "server.timeouts.request_head", line: 3, column: 19, message: "not a duration"),
        BadCase(name: "bad access_log", yaml: "server:\n  access_log: verbose\n" + minimal, path: "server.access_log", line: 2, column: 15, message: "text | json | off"),
        BadCase(name: "an ALPN protocol the gateway does not speak", yaml: "server:\n  tls: { certificate_file: /c, private_key_file: /k, alpn: [h2, h3] }\n" + minimal,
                path: "server.tls.alpn[1]", line: 2, column: 65, message: "is not 'h2' or 'http/1.1'"),
        BadCase(name: "an empty ALPN list", yaml: "server:\n  tls: { certificate_file: /c, private_key_file: /k, alpn: [] }\n" + minimal,
                path: "server.tls.alpn", line: 2, column: 60, message: "at least one protocol"),
        BadCase(name: "an ALPN protocol named twice", yaml: "server:\n  tls: { certificate_file: /c, private_key_file: /k, alpn: [h2, h2] }\n" + minimal,
                path: "server.tls.alpn", line: 2, column: 60, message: "names a protocol twice"),
        BadCase(name: "http2_cleartext not a bool", yaml: "server:\n  http2_cleartext: maybe\n" + minimal, path: "server.http2_cleartext", line: 2, column: 20, message: "true or false"),
        BadCase(name: "http2_cleartext on a TLS listener", yaml: "server:\n  http2_cleartext: true\n  tls: { certificate_file: /c, private_key_file: /k }\n" + minimal,
                path: "server.http2_cleartext", line: 2, column: 3, message: "without server.tls"),
        BadCase(name: "no concurrent stream", yaml: "server:\n  http2: { max_concurrent_streams: 0 }\n" + minimal, path: "server.http2.max_concurrent_streams", line: 2, column: 36,
                message: "must be between 1 and 1000"),
        BadCase(name: "too many concurrent streams", yaml: "server:\n  http2:\n    max_concurrent_streams: 1001\n" + minimal, path: "server.http2.max_concurrent_streams", line: 3, column: 29,
                message: "must be between 1 and 1000"),
        BadCase(name: "a header list below 1 KiB", yaml: "server:\n  http2:\n    max_header_list_size: 100\n" + minimal, path: "server.http2.max_header_list_size", line: 3, column: 27,
                message: "must be between 1024 and"),
        BadCase(name: "no stream reset allowed", yaml: "server:\n  http2:\n    max_stream_resets: 0\n" + minimal, path: "server.http2.max_stream_resets", line: 3, column: 24,
                message: "must be between 1 and"),
        BadCase(name: "an unknown http2 key", yaml: "server:\n  http2:\n    max_concurent_streams: 5\n" + minimal, path: "server.http2.max_concurent_streams", line: 3, column: 5,
                message: "did you mean 'max_concurrent_streams'?"),
    ]

    @Test("upstream reuse is principal by default; shared, none, max_in_flight, request_head and the connection caps parse")
    func reuseAndBounds() throws {
        let yaml = """
            server:
              timeouts: { request_head: 5s }
              limits: { max_connections: 10000, max_connections_per_client: 64, max_idle_upstream_connections: 64 }
            routes:
              - name: a
                upstream: "http://127.0.0.1:1"
                auth: public
              - name: b
                path_prefix: /b
                upstream: "http://127.0.0.1:2"
                auth: public
                upstream_reuse: shared
                max_in_flight: 200
                upstream_max_connections: 16
              - name: c
                path_prefix: /c
                upstream: "http://127.0.0.1:3"
                auth: public
                upstream_reuse: none
              - name: d
                path_prefix: /d
                upstream: "http://127.0.0.1:4"
                auth: public
                upstream_reuse: echo
                upstream_max_connections: 0
            """
        let c = try #require(GatewayConfiguration.parse(yaml: yaml).configuration)
        #expect(c.server.timeouts.requestHead == .seconds(5))
        #expect(GatewayConfiguration().server.timeouts.requestHead == .seconds(30))
        #expect(c.server.limits.maxConnections == 10000)
        #expect(c.server.limits.maxConnectionsPerClient == 64)
        #expect(c.routes.map(\.upstreamReuse) == [.principal, .shared, .none, .echo])
        #expect(c.routes.map(\.maxInFlight) == [0, 200, 0, 0])
        #expect(c.routes.map(\.upstreamMaxConnections) == [1024, 16, 1024, 0], "1,024 by default; 0: no bound")
        #expect(c.server.limits.maxIdleUpstreamConnections == 64)
        #expect(GatewayConfiguration().server.limits.maxIdleUpstreamConnections == 512)
    }

    @Test("HTTP/2: h2 and http/1.1 offered on TLS by default, h2c off, 100 streams, the head bound as header list, 200 resets")
    func http2Defaults() throws {
        let c = try #require(GatewayConfiguration.parse(yaml: "server:\n  tls: { certificate_file: /c, private_key_file: /k }\n" + Self.minimal).configuration)
        #expect(c.server.tls?.alpn == [.h2, .http11])
        #expect(c.server.http2Cleartext == false)
        #expect(c.server.http2.maxConcurrentStreams == 100)
        #expect(c.server.http2.maxHeaderListSize == nil)
        #expect(c.server.http2.headerListSize(c.server.limits) == 16 * 1024)
        #expect(c.server.http2.maxStreamResets == 200)
    }

    @Test("HTTP/2 keys parse: the ALPN order, h2c, the stream, header list and reset bounds")
    func http2Keys() throws {
        let yaml = """
            server:
              tls: { certificate_file: /c, private_key_file: /k, alpn: ["http/1.1"] }
              limits: { max_header_bytes: 8192 }
              http2: { max_concurrent_streams: 20, max_header_list_size: 32768, max_stream_resets: 50 }

            """ + Self.minimal
        let result = GatewayConfiguration.parse(yaml: yaml)
        let c = try #require(result.configuration, "\(result.errors)")
        #expect(c.server.tls?.alpn == [.http11])
        #expect(c.server.http2.maxConcurrentStreams == 20)
        #expect(c.server.http2.headerListSize(c.server.limits) == 32768)
        #expect(c.server.http2.maxStreamResets == 50)
        let cleartext = try #require(GatewayConfiguration.parse(yaml: "server:\n  http2_cleartext: true\n  limits: { max_header_bytes: 8192 }\n" + Self.minimal).configuration)
        #expect(cleartext.server.http2Cleartext)
        #expect(cleartext.server.http2.headerListSize(cleartext.server.limits) == 8192, "unset: the HTTP/1 head bound")
    }

    @Test("tracing: off without the section; its keys parse; grpc defaults to the collector's port 4317")
    func tracingKeys() throws {
        #expect(try #require(GatewayConfiguration.parse(yaml: Self.minimal).configuration).tracing == nil)
        let yaml = """
            tracing:
              endpoint: "https://otlp.example.com/v1/traces"
              sample_ratio: 0.01
              headers: { X-API-Key: "secret" }
              include_user: true
              service_name: legacy-gateway
              timeout: 3s
              max_queue: 1000

            """ + Self.minimal
        let t = try #require(GatewayConfiguration.parse(yaml: yaml).configuration?.tracing)
        #expect(t.endpoint == "https://otlp.example.com/v1/traces" && t.exportProtocol == .httpProtobuf && t.sampleRatio == 0.01)
        #expect(t.headers == ["x-api-key": "secret"] && t.includeUser && t.serviceName == "legacy-gateway")
        #expect(t.timeout == .seconds(3) && t.maxQueue == 1000)
        let defaults = try #require(GatewayConfiguration.parse(yaml: "tracing: {}\n" + Self.minimal).configuration?.tracing)
        #expect(defaults == GatewayConfiguration.Tracing() && defaults.endpoint == "http://127.0.0.1:4318/v1/traces" && defaults.sampleRatio == 1)
        let grpc = try #require(GatewayConfiguration.parse(yaml: "tracing: { protocol: grpc }\n" + Self.minimal).configuration?.tracing)
        #expect(grpc.exportProtocol == .grpc && grpc.endpoint == "http://127.0.0.1:4317")
    }

    @Test("a Redis Cluster is its nodes, with the scheme and credentials of redis_url")
    func clusterKeys() throws {
        let yaml = "store:\n  redis_url: \"rediss://gw:pw@cluster/0\"\n  cluster: { addresses: [\"10.0.0.1:6379\", \"[::1]:6380\"] }\n" + Self.minimal
        let result = GatewayConfiguration.parse(yaml: yaml)
        let c = try #require(result.configuration, "\(result.errors)")
        #expect(c.store.cluster?.addresses == [ListenAddress(host: "10.0.0.1", port: 6379), ListenAddress(host: "::1", port: 6380)])
        #expect(c.store.redisURL?.tls == true && c.store.redisURL?.username == "gw")
    }

    @Test("https upstreams, TLS, rediss:// and sentinels parse; skipping verification is a loud warning")
    func tlsKeys() throws {
        let yaml = """
            server:
              listen: "0.0.0.0:443"
              tls: { certificate_file: /etc/sg/cert.pem, private_key_file: /etc/sg/key.pem }
              redirect_http_listen: "0.0.0.0:80"
              timeouts: { tls_handshake: 3s }
            store:
              redis_url: "rediss://gw:pw@mymaster:6380/2"
              tls: { ca_file: /etc/sg/redis-ca.pem, certificate_file: /etc/sg/c.pem, private_key_file: /etc/sg/c.key, server_name: redis.internal }
              sentinel: { master_name: mymaster, addresses: ["10.0.0.1:26379", "[::1]:26380"], password: "env:SENTINEL_PASSWORD" }
            routes:
              - name: a
                upstream: "https://app.internal"
                upstream_ca_file: /etc/sg/internal-ca.pem
                upstream_server_name: app.internal
                auth: public
              - name: b
                path_prefix: /b/
                upstream: "https://127.0.0.1:8443"
                upstream_insecure_skip_verify: true
                auth: public
            """
        let result = GatewayConfiguration.parse(yaml: yaml)
        let c = try #require(result.configuration, "\(result.errors)")
        #expect(c.server.tls == .init(certificateFile: "/etc/sg/cert.pem", privateKeyFile: "/etc/sg/key.pem"))
        #expect(c.server.redirectHTTPListen == ListenAddress(host: "0.0.0.0", port: 80))
        #expect(c.server.timeouts.tlsHandshake == .seconds(3))
        #expect(c.store.redisURL?.tls == true)
        #expect(c.store.redisURL?.username == "gw")
        #expect(c.store.tls.serverName == "redis.internal")
        #expect(c.store.tls.privateKeyFile == "/etc/sg/c.key")
        #expect(c.store.sentinel?.addresses == [ListenAddress(host: "10.0.0.1", port: 26379), ListenAddress(host: "::1", port: 26380)])
        #expect(c.store.sentinel?.password == .environment("SENTINEL_PASSWORD"))
        #expect(c.routes[0].upstream == UpstreamURL(host: "app.internal", port: 443, tls: true))
        #expect(c.routes[0].upstreamServerName == "app.internal")
        #expect(c.routes[1].upstreamInsecureSkipVerify)
        let warning = result.problems.first { $0.path == "routes[1].upstream_insecure_skip_verify" }
        #expect(warning?.severity == .warning)
        #expect(warning?.message.contains("INSECURE") == true)
    }

    @Test("each problem names its key path and line:column", arguments: badCases)
    func badConfiguration(_ c: BadCase) throws {
        let result = GatewayConfiguration.parse(yaml: c.yaml)
        #expect(result.configuration == nil)
        let problem = try #require(result.errors.first { $0.path == c.path && $0.message.contains(c.message) }, "got: \(result.errors)")
        if c.line != nil || c.path.isEmpty == false {
            #expect(problem.line == c.line, "line of \(problem)")
            #expect(problem.column == c.column, "column of \(problem)")
        }
    }

    @Test("all problems are reported at once")
    func everyProblemAtOnce() {
        let yaml = """
            server:
              lisen: "x"
              admin_listen: "nope"
            store:
              timeout: "soon"
            routes:
              - name: a
                upstrem: "http://x:1"
            """
        let result = GatewayConfiguration.parse(yaml: yaml)
        let paths = Set(result.errors.map(\.path))
        #expect(paths.isSuperset(of: ["server.lisen", "server.admin_listen", "store.timeout", "routes[0].upstrem", "routes[0].upstream"]))
        #expect(result.configuration == nil)
    }

    @Test("identity.strip_headers: none by default; header names kept as written", arguments: [
        ("", [String]()),
        ("identity:\n  strip_headers: []\n", []),
        ("identity:\n  strip_headers: [X-Legacy-User, x_employee_id, \"X-Dept\"]\n", ["X-Legacy-User", "x_employee_id", "X-Dept"]),
    ])
    func stripHeaders(yaml: String, expected: [String]) throws {
        let result = GatewayConfiguration.parse(yaml: yaml + Self.minimal)
        #expect(result.errors == [], "\(result.errors)")
        #expect(try #require(result.configuration).identity.stripHeaders == expected)
    }

    @Test("warnings do not fail loading")
    func warnings() throws {
        let yaml = "server:\n  admin_listen: \"0.0.0.0:9091\"\n" + Self.minimal
        let result = GatewayConfiguration.parse(yaml: yaml)
        #expect(result.configuration != nil)
        #expect(result.warnings.contains { $0.path == "server.admin_listen" })
    }

    @Test("apple.clock_skew: 60s by default; set; over five minutes warns; negative is an error")
    func clockSkew() throws {
        let apple = "apple:\n  team_id: ABCDE12345\n  key_id: KEY1234567\n  client_ids: [a.b, a.app]\n  private_key_file: /k.p8\n"
        #expect(GatewayConfiguration.parse(yaml: apple + Self.minimal).configuration?.apple?.clockSkew == .seconds(60))
        #expect(GatewayConfiguration.parse(yaml: apple + "  clock_skew: 10s\n" + Self.minimal).configuration?.apple?.clockSkew == .seconds(10))
        let wide = GatewayConfiguration.parse(yaml: apple + "  clock_skew: 10m\n" + Self.minimal)
        #expect(wide.configuration?.apple?.clockSkew == .seconds(600))
        #expect(wide.warnings.map(\.path) == ["apple.clock_skew"])
        #expect(GatewayConfiguration.parse(yaml: apple + "  clock_skew: -1s\n" + Self.minimal).errors.map(\.path) == ["apple.clock_skew"])
    }

    @Test("client_ids without an App ID warns: Apple's notifications name the primary App ID")
    func noAppID() throws {
        let yaml = "apple:\n  team_id: ABCDE12345\n  key_id: KEY1234567\n  client_ids: [com.example.web]\n  private_key_file: /k.p8\n" + Self.minimal
        let result = GatewayConfiguration.parse(yaml: yaml)
        let warning = try #require(result.warnings.first { $0.path == "apple.client_ids" })
        #expect(warning.message.contains("App ID") && warning.line == 4)
        #expect(result.configuration != nil, "a warning, not an error")
    }

    /// The smallest file that signs in (memory store), with `sections` (top-level YAML, from
    /// line 8) before its one route.
    /// - Parameters:
    ///   - clientIDs: `apple.client_ids` as YAML.
    ///   - apple: more lines of the `apple` section, each starting with a newline and indented.
    static func signIn(_ sections: String = "", clientIDs: String = #"["com.example.web"]"#, apple: String = "") -> GatewayConfiguration.LoadResult {
        GatewayConfiguration.parse(yaml: """
            server:
              public_url: "https://app.example.com"
            apple:
              team_id: "ABCDE12345"
              key_id: "KEY1234567"
              client_ids: \(clientIDs)
              private_key_file: "/dev/null"\(apple)
            \(sections)
            routes:
              - name: app
                upstream: "http://127.0.0.1:9000"
            """)
    }

    @Test("session.cookie_domain must hold public_url's host, and a __Host- cookie cannot have one")
    func cookieDomain() throws {
        func parse(_ session: String) -> GatewayConfiguration.LoadResult { Self.signIn("session:\n" + session) }
        let fine = parse("  cookie_name: __Secure-sessiongate\n  cookie_domain: .Example.com")
        #expect(fine.errors == [], "\(fine.errors)")
        #expect(fine.configuration?.session.cookieDomain == "example.com", "lower case, the leading dot dropped")
        let hostPrefix = parse("  cookie_domain: example.com")
        #expect(hostPrefix.errors.map(\.path) == ["session.cookie_domain"])
        #expect(hostPrefix.errors.first?.message.contains("__Host-") == true)
        let elsewhere = parse("  cookie_name: __Secure-sessiongate\n  cookie_domain: example.net")
        #expect(elsewhere.errors.map(\.path) == ["session.cookie_domain"])
        #expect(elsewhere.errors.first?.message.contains("app.example.com") == true)
        let malformed = parse("  cookie_name: __Secure-sessiongate\n  cookie_domain: https://example.com")
        #expect(malformed.errors.map(\.path) == ["session.cookie_domain"])
        #expect(malformed.errors.first?.line == 10)
    }

    @Test("apple.app_groups: client ids of client_ids, each in one group; absent: one group of all")
    func appGroups() throws {
        func parse(_ groups: String) -> GatewayConfiguration.LoadResult {
            Self.signIn(clientIDs: #"["com.example.web", "com.example.app", "com.other.app"]"#, apple: groups.isEmpty ? "" : "\n" + groups)
        }
        #expect(parse("").configuration?.apple?.appGroups == nil)
        let fine = parse(#"  app_groups: [["com.example.app", "com.example.web"], ["com.other.app"]]"#)
        #expect(fine.errors == [], "\(fine.errors)")
        #expect(fine.configuration?.apple?.appGroups == [["com.example.app", "com.example.web"], ["com.other.app"]])
        for (groups, message) in [
            (#"[["com.example.app", "com.example.web"], ["com.unknown"]]"#, "is not a client id of apple.client_ids"),
            (#"[["com.example.app", "com.example.web"], ["com.other.app", "com.example.web"]]"#, "in two groups"),
            (#"[["com.example.app", "com.example.web"]]"#, "leaves out com.other.app"),
            (#"[["com.example.app", "com.example.web", "com.other.app"], []]"#, "empty group"),
            (#"["com.example.app"]"#, "expected a list"),
        ] {
            let refused = parse("  app_groups: " + groups)
            #expect(refused.errors.count == 1 && refused.errors.first?.path.hasPrefix("apple.app_groups") == true, "\(groups): \(refused.errors)")
            #expect(refused.errors.first?.message.contains(message) == true, "\(groups): \(refused.errors)")
        }
    }

    @Test("a route that needs sign-in needs apple, public_url and (with Redis) a session secret")
    func signInRequirements() throws {
        let yaml = """
            store:
              redis_url: "redis://127.0.0.1:6379"
            routes:
              - name: app
                upstream: "http://127.0.0.1:9000"
            """
        let result = GatewayConfiguration.parse(yaml: yaml)
        #expect(Set(result.errors.map(\.path)) == ["apple", "server.public_url", "session.secret_file"])
        let memory = Self.signIn()
        #expect(memory.errors == [], "\(memory.errors)")
        #expect(memory.warnings.map(\.path) == ["apple.client_ids", "session.secret_file"])
        #expect(memory.configuration?.routes[0].auth == .required, "auth defaults to required")
    }

    /// The return URL Apple is given is `public_url` + `auth_prefix` + `/callback`: with Apple's
    /// own `base_url`, a URL Apple refuses (http, an IP address, localhost) is an error at
    /// `server.public_url`; with the simulator's, the simulator is the judge (loopback http only
    /// behind its `--allow-http-loopback`), so it passes.
    @Test("server.public_url with Apple's base_url: https and a domain name, else an error with its line", arguments: [
        ("a domain over https", "https://app.example.com", nil, false),
        ("a domain over https, with a port", "https://app.example.com:8443", nil, false),
        ("Apple's base_url written out", "https://app.example.com", "https://appleid.apple.com", false),
        ("plain http", "http://app.example.com", nil, true),
        ("plain http, base_url written out", "http://app.example.com", "https://appleid.apple.com/", true),
        ("an IPv4 literal over https", "https://203.0.113.7", nil, true),
        ("an IPv6 literal over https", "https://[2001:db8::1]:8443", nil, true),
        ("localhost over https", "https://localhost:8443", nil, true),
        ("LOCALHOST in capitals", "https://LOCALHOST", nil, true),
        ("a .localhost name", "https://app.localhost", nil, true),
        ("a name without a dot (an intranet host)", "https://intranet", nil, true),
        ("loopback http", "http://localhost:8080", nil, true),
        ("loopback http with the simulator", "http://localhost:8080", "http://127.0.0.1:9092", false),
        ("an IP literal with the simulator", "http://127.0.0.1:8080", "http://127.0.0.1:9092", false),
    ] as [(String, String, String?, Bool)])
    func appleReturnURL(name: String, publicURL: String, baseURL: String?, refused: Bool) throws {
        let yaml = """
            server:
              public_url: "\(publicURL)"
            apple:
              team_id: "ABCDE12345"
              key_id: "KEY1234567"
              client_ids: ["com.example.web", "com.example.app"]
              private_key_file: "/dev/null"\(baseURL.map { "\n  base_url: \"\($0)\"" } ?? "")
            routes:
              - name: app
                upstream: "http://127.0.0.1:9000"
            """
        let result = GatewayConfiguration.parse(yaml: yaml)
        let problem = result.errors.first { $0.path == "server.public_url" }
        #expect((problem != nil) == refused, "\(name): \(result.errors)")
        if let problem {
            #expect(problem.line == 2, "\(name): at the key's line")
            #expect(problem.message.contains("Apple") && problem.message.contains("https"), "\(name): \(problem.message)")
            #expect(problem.description.hasPrefix("2:"), "\(name): \(problem.description)")
        }
    }

    @Test("a missing file is an error, not a crash")
    func missingFile() {
        let result = GatewayConfiguration.load(file: "/nonexistent/sessiongate.yaml")
        #expect(result.configuration == nil)
        #expect(result.errors.first?.message.contains("cannot read") == true)
    }

    @Test("problems print as file:line:column: severity: path: message")
    func problemFormat() {
        let error = ConfigError(file: "x.yaml", problems: [ConfigProblem(.error, path: "server.lisen", line: 3, column: 5, message: "unknown key")])
        #expect(error.description == "x.yaml:3:5: error: server.lisen: unknown key")
    }
}

@Suite("Configuration values")
struct ConfigValueTests {
    @Test("durations", arguments: [
        ("250ms", Duration.milliseconds(250)), ("5s", .seconds(5)), ("10m", .seconds(600)), ("12h", .seconds(43_200)),
        ("30d", .seconds(2_592_000)), ("1h30m", .seconds(5400)), ("0s", .zero),
    ])
    func durations(text: String, expected: Duration) {
        #expect(ConfigDuration.parse(text) == expected)
    }

    @Test("invalid durations", arguments: ["", "5", "s", "5 s", "-5s", "5x", "1.5s", "99999999999999999999d", "5S"])
    func invalidDurations(text: String) {
        #expect(ConfigDuration.parse(text) == nil)
    }

    @Test("CIDR membership", arguments: [
        ("10.0.0.0/8", "10.1.2.3", true), ("10.0.0.0/8", "11.0.0.1", false), ("127.0.0.1", "127.0.0.1", true),
        ("127.0.0.1", "127.0.0.2", false), ("192.168.1.0/24", "192.168.1.255", true), ("0.0.0.0/0", "8.8.8.8", true),
        ("::1/128", "::1", true), ("fd00::/8", "fd12::1", true), ("fd00::/8", "fe80::1", false), ("10.0.0.0/8", "::1", false),
    ])
    func cidr(network: String, address: String, inside: Bool) throws {
        let cidr = try #require(CIDR.parse(network))
        let ip = try #require(IPAddress.parse(address))
        #expect(cidr.contains(ip) == inside)
    }

    @Test("listen addresses", arguments: [
        ("0.0.0.0:8080", "0.0.0.0", 8080), ("[::]:80", "::", 80), ("localhost:1", "localhost", 1),
    ])
    func listen(text: String, host: String, port: Int) {
        #expect(ListenAddress.parse(text) == ListenAddress(host: host, port: port))
    }

    @Test("redis URLs")
    func redisURLs() throws {
        let url = try #require(RedisURL.parse("redis://:p%40ss@10.0.0.5:6380/2"))
        #expect(url.host == "10.0.0.5")
        #expect(url.port == 6380)
        #expect(url.database == 2)
        #expect(url.password == "p@ss")
        #expect(RedisURL.parse("redis://localhost")?.port == 6379)
        #expect(RedisURL.parse("redis://localhost/x") == nil)
        // An ACL user: user:password (the password may hold ':' and an encoded '@').
        let acl = try #require(RedisURL.parse("redis://gateway:s3:cr%40t@redis.internal"))
        #expect(acl.username == "gateway" && acl.password == "s3:cr@t" && acl.host == "redis.internal")
    }

    @Test("a Redis URL password is percent-decoded only where an escape is % and two hex digits; anything else is kept as written")
    func redisPasswordEscapes() throws {
        for (written, password) in [("p%40ss", "p@ss"), ("p%+fss", "p%+fss"), ("p%-0ss", "p%-0ss"), ("100%", "100%"), ("%zz", "%zz")] {
            let url = try #require(RedisURL.parse("redis://:\(written)@10.0.0.5:6380/2"), "\(written)")
            #expect(url.password == password, "\(written)")
        }
    }
}
