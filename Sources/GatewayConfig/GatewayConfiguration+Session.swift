extension GatewayConfiguration.Session {
    enum Key: String, ConfigKey {
        case cookieName = "cookie_name", cookieDomain = "cookie_domain", secretFile = "secret_file", idleTimeout = "idle_timeout", absoluteTimeout = "absolute_timeout"
    }

    /// Reads `session`: each key the file sets replaces its default; idle fits inside absolute.
    mutating func read(_ s: ConfigReader.Section<Key>, _ r: ConfigReader) {
        if let v = r.string(s, .cookieName) {
            if GatewayConfiguration.isToken(v) { cookieName = v }
            else { r.report(s, .cookieName, "'\(v)' is not a valid cookie name") }
        }
        if let v = r.string(s, .cookieDomain) {
            var name = v.lowercased()
            if name.hasPrefix(".") { name.removeFirst() }  // RFC 6265 §5.2.3: a leading dot is ignored
            if HostName.isValid(name, allowingUnderscore: false), name.contains(".") || name == "localhost" { cookieDomain = name }
            else { r.report(s, .cookieDomain, "'\(v)' is not a parent domain like example.com (no scheme, no port)") }
        }
        if let v = r.string(s, .secretFile) {
            if let ref = SecretReference.parse(v) { secretFile = ref }
            else { r.report(s, .secretFile, "'\(v)' is not a file path or env:NAME") }
        }
        if let v = r.duration(s, .idleTimeout, atLeast: .seconds(1)) { idleTimeout = v }
        if let v = r.duration(s, .absoluteTimeout, atLeast: .seconds(1)) { absoluteTimeout = v }
        if idleTimeout > absoluteTimeout {
            r.report(s, .idleTimeout, "is longer than session.absolute_timeout (\(ConfigDuration.format(absoluteTimeout)))")
        }
    }
}
