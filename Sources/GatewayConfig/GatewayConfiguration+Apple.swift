extension GatewayConfiguration.Apple {
    enum Key: String, ConfigKey {
        case teamID = "team_id", clientIDs = "client_ids", keyID = "key_id", privateKeyFile = "private_key_file"
        case baseURL = "base_url", scopes, revalidateAfter = "revalidate_after", revalidateGrace = "revalidate_grace"
        case outageGrace = "outage_grace", timeout, clockSkew = "clock_skew", nativeNonce = "native_nonce"
        case exchangesPerMinute = "exchanges_per_minute", loginsPerMinute = "logins_per_minute"
        case maxPendingLogins = "max_pending_logins", appGroups = "app_groups"
    }

    /// Reads `apple`: the team, key and client ids are required; the rest have defaults.
    init(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        self.init()
        if let v = Self.required(s, .teamID, r) {
            if Self.isIdentifier(v) { teamID = v }
            else { r.report(s, .teamID, "'\(v)' is not a 10-character Apple Team ID (A-Z, 0-9)") }
        }
        if let v = Self.required(s, .keyID, r) {
            if Self.isIdentifier(v) { keyID = v }
            else { r.report(s, .keyID, "'\(v)' is not a 10-character Apple Key ID (A-Z, 0-9)") }
        }
        readClientIDs(s, r)
        if s[.privateKeyFile] == nil { r.reportMissing(s, .privateKeyFile, "is required (the AuthKey_<key id>.p8 file, or env:NAME)") }
        if let v = r.string(s, .privateKeyFile) {
            if let ref = SecretReference.parse(v) { privateKeyFile = ref }
            else { r.report(s, .privateKeyFile, "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.string(s, .baseURL) {
            if let origin = GatewayConfiguration.parseOrigin(v) {
                baseURL = origin
                if origin.hasPrefix("http://"), !GatewayConfiguration.isLoopbackOrigin(origin) {
                    r.warn(s, .baseURL, "plain http to a non-loopback host: only for a simulator on a private network")
                }
            } else { r.report(s, .baseURL, "'\(v)' is not an origin like https://appleid.apple.com") }
        }
        if let v = r.list(s, .scopes, what: "a scope (name or email)", parse: { ["name", "email"].contains($0) ? $0 : nil }) { scopes = v }
        readDurations(s, r)
        if let v = r.enumeration(s, .nativeNonce, as: GatewayConfiguration.NativeNonce.self) { nativeNonce = v }
        if let v = r.int(s, .exchangesPerMinute, range: 0...100_000) { exchangesPerMinute = v }
        if let v = r.int(s, .loginsPerMinute, range: 0...100_000) { loginsPerMinute = v }
        if let v = r.int(s, .maxPendingLogins, range: 0...10_000_000) { maxPendingLogins = v }
        if let v = r.duration(s, .clockSkew, atLeast: .zero) {
            clockSkew = v
            if v > .seconds(300) {
                r.warn(s, .clockSkew, "more than 5m of tolerated skew lets expired identity tokens through for as long; fix the host's clock (NTP) instead")
            }
        }
    }

    private static func required(_ s: ConfigReader.Section<Key>, _ key: Key, _ r: ConfigReader) -> String? {
        if s[key] == nil { r.reportMissing(s, key, "is required"); return nil }
        return r.string(s, key)
    }

    /// The Services ID first, then any App IDs: at least one, none twice.
    private mutating func readClientIDs(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if s[.clientIDs] == nil { r.reportMissing(s, .clientIDs, "is required: your Services ID first, then any App IDs") }
        guard let v = r.list(s, .clientIDs, what: "a client id (e.g. com.example.web)", parse: { id in
            id.isEmpty || id.contains(where: { $0.isWhitespace || !$0.isASCII }) ? nil : id
        }) else { return }
        if v.isEmpty { r.report(s, .clientIDs, "needs at least one client id") }
        else if Set(v).count != v.count { r.report(s, .clientIDs, "lists a client id twice") }
        else if v.count == 1 {
            r.warn(s, .clientIDs,
                   "lists no App ID: Apple's server-to-server notifications (account deleted, consent revoked, email changes) name the primary App ID as their audience and would be refused; add it after the Services ID")
        }
        clientIDs = v
        guard let groups = r.lists(s, .appGroups, what: "a client id of apple.client_ids", parse: { v.contains($0) ? $0 : nil }) else { return }
        let listed = groups.flatMap { $0 }
        if groups.contains(where: \.isEmpty) { r.report(s, .appGroups, "has an empty group") }
        else if Set(listed).count != listed.count { r.report(s, .appGroups, "lists a client id in two groups: a client belongs to one app group") }
        else if Set(listed) != Set(v) { r.report(s, .appGroups, "leaves out \(v.filter { !listed.contains($0) }.joined(separator: ", ")): every client id belongs to one group") }
        else { appGroups = groups }
    }

    private mutating func readDurations(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.duration(s, .revalidateAfter, atLeast: .seconds(1)) {
            revalidateAfter = v
            if v < .seconds(86_400) {
                r.warn(s, .revalidateAfter, "Apple asks relying parties to validate a refresh token at most once a day; below 24h risks throttling")
            }
        }
        if let v = r.duration(s, .revalidateGrace, atLeast: .zero) { revalidateGrace = v }
        if let v = r.duration(s, .outageGrace, atLeast: .zero) { outageGrace = v }
        if let v = r.duration(s, .timeout) { timeout = v }
    }
}

extension GatewayConfiguration {
    /// Apple's `redirect_uri` for the web flow, `server.public_url` + `server.auth_prefix` +
    /// `/callback`: what must be registered with the Services ID. Nil without `apple` or a
    /// public URL.
    public var appleReturnURL: String? {
        guard apple != nil, let publicURL = server.publicURL else { return nil }
        return publicURL + server.authPrefix + "/callback"
    }
}
