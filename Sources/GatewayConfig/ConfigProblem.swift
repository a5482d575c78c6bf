/// One thing wrong (or doubtful) in a configuration file, located by key path and position.
///
/// Loading collects every problem before giving up, so an operator fixes a file in one pass.
public struct ConfigProblem: Sendable, Equatable, CustomStringConvertible {
    public enum Severity: String, Sendable, Equatable {
        case error
        case warning
    }

    public var severity: Severity
    /// Dotted key path with list indices, e.g. `routes[0].upstream`; empty for the document.
    public var path: String
    /// 1-based line and column of the offending node, when the node exists in the file.
    public var line: Int?
    public var column: Int?
    public var message: String

    public init(_ severity: Severity, path: String, line: Int? = nil, column: Int? = nil, message: String) {
        self.severity = severity
        self.path = path
        self.line = line
        self.column = column
        self.message = message
    }

    /// `12:5: error: routes[0].upstrem: unknown key (did you mean 'upstream'?)`
    public var description: String {
        var out = ""
        if let line, let column { out += "\(line):\(column): " }
        out += "\(severity.rawValue): "
        if !path.isEmpty { out += "\(path): " }
        return out + message
    }
}

/// Loading failed: every problem found, errors and warnings alike.
public struct ConfigError: Error, Sendable, CustomStringConvertible {
    public var file: String
    public var problems: [ConfigProblem]

    public init(file: String, problems: [ConfigProblem]) {
        self.file = file
        self.problems = problems
    }

    public var description: String {
        problems.map { "\(file):\($0)" }.joined(separator: "\n")
    }
}

/// A 1-based line and column in the configuration file.
public struct ConfigLocation: Sendable, Equatable {
    public var line: Int
    public var column: Int

    public init(line: Int, column: Int) {
        self.line = line
        self.column = column
    }

    /// Where `path` is in the file, or — when the file does not set it — its nearest enclosing
    /// key that the file has (`server.timeouts.idle` → `server.timeouts` → `server`).
    public static func nearest(_ path: String, in locations: [String: ConfigLocation]) -> ConfigLocation? {
        var key = Substring(path)
        while true {
            if let location = locations[String(key)] { return location }
            guard let dot = key.lastIndex(where: { $0 == "." || $0 == "[" }) else { return nil }
            key = key[..<dot]
        }
    }
}

/// A start-up failure bound to one configuration key: a secret that cannot be read or is too
/// short, a key file that does not parse, a name that does not resolve, an address in use.
/// `check` and `serve` report it alike, as `file:line:col: error: key: message`.
public struct StartupFailure: Error, Sendable, CustomStringConvertible {
    public var key: String
    public var message: String

    public init(key: String, _ message: String) {
        self.key = key
        self.message = message
    }

    public var description: String { "\(key): \(message)" }

    public func problem(locations: [String: ConfigLocation], severity: ConfigProblem.Severity = .error) -> ConfigProblem {
        let location = ConfigLocation.nearest(key, in: locations)
        return ConfigProblem(severity, path: key, line: location?.line, column: location?.column, message: message)
    }
}
