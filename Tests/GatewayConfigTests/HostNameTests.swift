import Testing

@testable import GatewayConfig

/// One host-name rule (`HostName`), used by every key that holds a host name. Rows marked
/// "changed" load differently than before the rule was shared (each key had its own copy).
@Suite("Host names")
struct HostNameTests {
    /// The keys that hold a host name, each read the way a configuration file sets it.
    enum Use: String, Sendable {
        case routeHost = "routes[0].host"
        case redirectHost = "server.allowed_redirect_hosts[0]"
        case upstreamServerName = "routes[0].upstream_server_name"
        case storeServerName = "store.tls.server_name"
        case emailDomain = "routes[0].allow.email_domains[0]"

        func yaml(_ value: String) -> String {
            // A route that needs sign-in, so that `allow` means something; in memory, so no secret.
            let signIn = """
                server:
                  public_url: "https://app.example.com"
                apple:
                  team_id: ABCDE12345
                  key_id: KEY1234567
                  client_ids: [com.example.web, com.example.app]
                  private_key_file: /k.p8

                """
            let route = "routes:\n  - name: a\n    upstream: \"https://127.0.0.1:9000\"\n"
            switch self {
            case .routeHost: return signIn + route + "    host: \"\(value)\"\n"
            case .redirectHost: return signIn.replacingOccurrences(of: "apple:", with: "  allowed_redirect_hosts: [\"\(value)\"]\napple:") + route
            case .upstreamServerName: return signIn + route + "    upstream_server_name: \"\(value)\"\n"
            case .storeServerName: return signIn + "store:\n  redis_url: \"rediss://r:6380\"\n  tls: { server_name: \"\(value)\" }\nsession:\n  secret_file: /s.key\n" + route
            case .emailDomain: return signIn + route + "    allow: { email_domains: [\"\(value)\"] }\n"
            }
        }

        func loaded(_ c: GatewayConfiguration) -> String? {
            switch self {
            case .routeHost: c.routes.first?.host
            case .redirectHost: c.server.allowedRedirectHosts.first
            case .upstreamServerName: c.routes.first?.upstreamServerName
            case .storeServerName: c.store.tls.serverName
            case .emailDomain: c.routes.first?.allow.emailDomains.first
            }
        }
    }

    struct Row: CustomTestStringConvertible, Sendable {
        let use: Use
        let value: String
        /// What the configuration holds; nil: refused, at the key.
        let loads: String?
        let why: String
        var testDescription: String { "\(use.rawValue): '\(value.count > 40 ? String(value.prefix(20)) + "…" : value)' → \(loads.map { "'\($0)'" } ?? "refused") (\(why))" }
    }

    static let label63 = String(repeating: "a", count: 63)
    static let label64 = String(repeating: "a", count: 64)
    /// 63 + 1 + 63 + 1 + 63 + 1 + 61 = 253 characters; one more is too long.
    static let name253 = [label63, label63, label63, String(repeating: "b", count: 61)].joined(separator: ".")

    static let rows: [Row] = [
        // A route's host is compared with a request's Host, which admits `_`; normalized as it is.
        Row(use: .routeHost, value: "app.example.com", loads: "app.example.com", why: "a name"),
        Row(use: .routeHost, value: "App.Example.COM.", loads: "app.example.com", why: "lower case, one trailing dot dropped"),
        Row(use: .routeHost, value: "under_score.internal", loads: "under_score.internal", why: "requests may carry `_`"),
        Row(use: .routeHost, value: "10.0.0.1", loads: "10.0.0.1", why: "an IPv4 address"),
        Row(use: .routeHost, value: "\(label63).example", loads: "\(label63).example", why: "a 63-character label"),
        Row(use: .routeHost, value: name253, loads: name253, why: "253 characters"),
        Row(use: .routeHost, value: "a..b", loads: nil, why: "an empty label"),
        Row(use: .routeHost, value: ".example.com", loads: nil, why: "an empty label"),
        Row(use: .routeHost, value: "app.example.com:8080", loads: nil, why: "no port"),
        Row(use: .routeHost, value: "a..", loads: nil, why: "changed: was 'a.', which no request can carry"),
        Row(use: .routeHost, value: "-app.example.com", loads: nil, why: "changed: a label begins with -"),
        Row(use: .routeHost, value: "app-.example.com", loads: nil, why: "changed: a label ends with -"),
        Row(use: .routeHost, value: "\(label64).example", loads: nil, why: "changed: a 64-character label"),
        Row(use: .routeHost, value: name253 + "b", loads: nil, why: "changed: 254 characters"),
        // `rd` hosts: the return-URL check admits no `_`, so neither does its allow list.
        Row(use: .redirectHost, value: ".Example.com", loads: ".example.com", why: "a suffix, lower-cased"),
        Row(use: .redirectHost, value: "app.example.com", loads: "app.example.com", why: "a name"),
        Row(use: .redirectHost, value: "a_b.example.com", loads: nil, why: "`rd` hosts admit no `_`"),
        Row(use: .redirectHost, value: "app.example.com.", loads: nil, why: "no trailing dot"),
        Row(use: .redirectHost, value: "..example.com", loads: nil, why: "an empty label"),
        Row(use: .redirectHost, value: ".-example.com", loads: nil, why: "changed: a label begins with -"),
        // SNI names go out as written; RFC 6066 §3: a host name, no trailing dot, no address.
        Row(use: .upstreamServerName, value: "App.Internal", loads: "App.Internal", why: "kept as written"),
        Row(use: .upstreamServerName, value: "app_1.internal", loads: nil, why: "no `_`"),
        Row(use: .upstreamServerName, value: "-app.internal", loads: nil, why: "a name begins with -"),
        Row(use: .upstreamServerName, value: "app.internal.", loads: nil, why: "changed: SNI carries no trailing dot"),
        Row(use: .upstreamServerName, value: "app.-internal", loads: nil, why: "changed: a label begins with -"),
        Row(use: .upstreamServerName, value: "app-.internal", loads: nil, why: "changed: a label ends with -"),
        Row(use: .storeServerName, value: "redis.internal", loads: "redis.internal", why: "a name"),
        Row(use: .storeServerName, value: "a b", loads: nil, why: "no space"),
        Row(use: .storeServerName, value: "redis.internal.", loads: nil, why: "changed: SNI carries no trailing dot"),
        Row(use: .storeServerName, value: "\(label64).internal", loads: nil, why: "changed: a 64-character label"),
        // An email's domain (RFC 5321): compared whole, so a form no address has never matched.
        Row(use: .emailDomain, value: "Example.com", loads: "example.com", why: "lower-cased"),
        Row(use: .emailDomain, value: "a_b.com", loads: nil, why: "no `_`"),
        Row(use: .emailDomain, value: "@example.com", loads: nil, why: "a domain, not an address"),
        Row(use: .emailDomain, value: ".example.com", loads: nil, why: "changed: matched no address"),
        Row(use: .emailDomain, value: "example.com.", loads: nil, why: "changed: matched no address"),
        Row(use: .emailDomain, value: "a..b.com", loads: nil, why: "changed: matched no address"),
        Row(use: .emailDomain, value: "-a.com", loads: nil, why: "changed: a label begins with -"),
    ]

    @Test("every key that holds a host name follows the one rule", arguments: rows)
    func hostName(_ row: Row) throws {
        let result = GatewayConfiguration.parse(yaml: row.use.yaml(row.value))
        if let expected = row.loads {
            let c = try #require(result.configuration, "\(result.errors)")
            #expect(row.use.loaded(c) == expected)
        } else {
            #expect(result.configuration == nil)
            #expect(result.errors.map(\.path) == [row.use.rawValue], "\(result.errors)")
        }
    }

    @Test("`_` is allowed only where the caller says so", arguments: [("under_score.example", true), ("under_score.example", false)])
    func underscore(name: String, allowed: Bool) {
        #expect(HostName.isValid(name, allowingUnderscore: allowed) == allowed)
    }
}
