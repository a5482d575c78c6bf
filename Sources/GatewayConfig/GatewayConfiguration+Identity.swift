extension GatewayConfiguration.Identity {
    enum Key: String, ConfigKey {
        case assertion, headers, headerPrefix = "header_prefix", stripHeaders = "strip_headers", links
        case linkURL = "link_url", linkLookupURL = "link_lookup_url"
    }

    /// `identity.links`.
    enum LinksKey: String, ConfigKey {
        case secretFile = "secret_file"
    }

    /// Reads `identity`: each key the file sets replaces its default.
    mutating func read(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        readLinks(s, r)
        if let v = r.string(s, .headerPrefix) {
            // A prefix of a header name: a token, and long enough not to swallow ordinary headers.
            if v.isEmpty || (GatewayConfiguration.isToken(v) && v.count >= 3) { headerPrefix = v }
            else { r.report(s, .headerPrefix, "'\(v)' is not a header-name prefix like X-Auth- (at least 3 characters; empty turns it off)") }
        }
        if let v = r.list(s, .stripHeaders, what: "a header name (X-Legacy-User)", parse: { GatewayConfiguration.isToken($0) ? $0 : nil }) {
            stripHeaders = v
        }
        if let a = r.section(s, .assertion, keys: Assertion.Key.self) { assertion.read(a, r) }
        if let h = r.section(s, .headers, keys: IdentityHeaderNames.Key.self) {
            headers.read(h, r)
            let normalized = headers.all.map { $0.lowercased().replacingUnderscores }
            if Set(normalized).count != normalized.count {
                r.report(s, .headers, "two identity headers have the same name (case, '_' and '-' do not distinguish names)")
            }
        }
    }

    /// `link_url`, `links` and `link_lookup_url`: account linking.
    private mutating func readLinks(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.string(s, .linkURL) {
            let isPath = v.hasPrefix("/") && !v.hasPrefix("//") && !v.contains("\\") && v.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f })
            if isPath || GatewayConfiguration.isWebURL(v) { linkURL = v }
            else { r.report(s, .linkURL, "'\(v)' is not a path (/link-account) or an http(s) URL") }
        }
        if let l = r.section(s, .links, keys: LinksKey.self), let v = r.string(l, .secretFile) {
            if let ref = SecretReference.parse(v) { linksSecretFile = ref }
            else { r.report(l, .secretFile, "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.string(s, .linkLookupURL) {
            if GatewayConfiguration.isWebURL(v) { linkLookupURL = v }
            else { r.report(s, .linkLookupURL, "'\(v)' is not an http:// or https:// URL with a host") }
            if linksSecretFile == nil {
                r.report(s, .linkLookupURL, "needs identity.links.secret_file: the gateway sends it as the bearer token, so the app knows who asks")
            }
        }
    }
}

extension GatewayConfiguration.Identity.Assertion {
    enum Key: String, ConfigKey {
        case enabled, keyFile = "key_file", ttl
    }

    /// Reads `identity.assertion`: enabled needs a key.
    mutating func read(_ a: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.bool(a, .enabled) { enabled = v }
        if let v = r.string(a, .keyFile) {
            if let ref = SecretReference.parse(v) { keyFile = ref }
            else { r.report(a, .keyFile, "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.duration(a, .ttl, atLeast: .seconds(1)) { ttl = v }
        if enabled, keyFile == nil {
            r.reportMissing(a, .keyFile, "is required when assertion.enabled is true")
        }
    }
}

extension IdentityHeaderNames {
    /// `identity.headers`: one key per header.
    enum Key: String, ConfigKey {
        case user, email, emailVerified = "email_verified", privateEmail = "private_email", emailForwarding = "email_forwarding"
        case name, realUserStatus = "real_user_status", account, formerUser = "former_user", assertion

        var field: WritableKeyPath<IdentityHeaderNames, String> {
            switch self {
            case .user: \.user
            case .email: \.email
            case .emailVerified: \.emailVerified
            case .privateEmail: \.privateEmail
            case .emailForwarding: \.emailForwarding
            case .name: \.name
            case .realUserStatus: \.realUserStatus
            case .account: \.account
            case .formerUser: \.formerUser
            case .assertion: \.assertion
            }
        }
    }

    mutating func read(_ h: ConfigReader.Section<Key>, _ r: ConfigReader) {
        for key in Key.allCases {
            guard let v = r.string(h, key) else { continue }
            if GatewayConfiguration.isToken(v) { self[keyPath: key.field] = v }
            else { r.report(h, key, "'\(v)' is not a valid header name") }
        }
    }
}

extension String {
    /// `_` written as `-`: header names compare so (`X_Auth_User` is `X-Auth-User`).
    var replacingUnderscores: String { String(map { $0 == "_" ? "-" : $0 }) }
}
