/// Why a Redis command failed.
public enum RedisError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Redis answered with an error reply (`WRONGTYPE …`, `READONLY …`), classified by its kind.
    case server(RedisErrorReply)
    /// No answer within the command timeout (`store.timeout`).
    case timeout
    /// Not connected (connecting, backing off after a failure, or the connection dropped).
    case unavailable
    /// The byte stream was not RESP (what was wrong with it); the connection is closed.
    case protocolError(String)
    /// The TLS handshake failed (certificate not trusted, wrong name, client certificate refused).
    case tls(String)
    /// No sentinel could name the master: none answered, or (`unknownMaster`) none knows the name.
    case sentinel(String)
    case unknownMaster(String)
    /// The server dialled is not (or no longer) the master: behind sentinels, or a standalone
    /// name that still points at a demoted primary (`ROLE` says replica).
    case notMaster

    /// The server will not run this command for this client: an ACL without the command's
    /// category (`NOPERM`), or a command renamed away (`ERR unknown command`). Retrying it is
    /// pointless; a caller with another way to the same answer should take it.
    public var isRefusedCommand: Bool {
        guard case .server(let reply) = self else { return false }
        return reply.kind == .noPermission || reply.kind == .unknownCommand
    }

    public var description: String {
        switch self {
        case .server(let reply): return "redis error: \(reply.message.prefix(120))"
        case .timeout: return "redis timeout"
        case .unavailable: return "redis unavailable"
        case .protocolError(let reason): return "redis protocol error: \(reason)"
        case .tls(let detail): return "TLS handshake with redis failed: \(detail)"
        case .sentinel(let detail): return "redis sentinel: \(detail)"
        case .unknownMaster(let name): return "redis sentinel: no sentinel knows a master named '\(name)'"
        case .notMaster: return "the server dialled is not the master (a replica: a failover in progress, or a name not yet moved)"
        }
    }
}

/// An error reply, read once into the kind code acts on; the text is kept for log lines only.
/// Redis names the kind in the reply's first word (`READONLY You can't write against a read
/// only replica.`); a few old or generic ones (`ERR invalid password`, `ERR DB index is out of
/// range`) are told apart by their text here, and nowhere else.
public struct RedisErrorReply: Equatable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
    public enum Kind: Equatable, Sendable {
        /// A replica refused a write: the primary was demoted (a failover).
        case readOnly
        /// The server is loading its data set after a restart.
        case loading
        /// Redis Cluster: the slot is served at this address now (`MOVED`), or for this one
        /// command while it migrates (`ASK`).
        case moved(RedisAddress)
        case ask(RedisAddress)
        /// Redis Cluster: keys of one command split by a migration, or the cluster is down.
        case tryAgain
        case clusterDown
        /// `EVALSHA` of a script this server has not cached.
        case noScript
        /// `maxmemory` reached with a policy that refuses writes.
        case outOfMemory
        /// A script or module command runs too long, or the replica lost its master
        /// (`MASTERDOWN`, with `replica-serve-stale-data no`).
        case busy
        case masterDown
        /// `NOAUTH`, `WRONGPASS` and the older `ERR` texts for a wrong or needless password.
        case authentication
        /// `NOPERM`: the ACL user may not run the command or touch the key.
        case noPermission
        /// A command renamed away or not in this version.
        case unknownCommand
        /// `SELECT` of a database the server does not have.
        case noDatabase
        /// Anything else (`WRONGTYPE`, `ERR syntax error`, a script's own error): an error of
        /// the command itself.
        case other
    }

    public let kind: Kind
    public let message: String

    public init(_ message: String) {
        self.message = message
        kind = Self.classify(message)
    }

    public init(stringLiteral message: String) { self.init(message) }

    public var description: String { message }

    private static func classify(_ message: String) -> Kind {
        let words = message.split(separator: " ", maxSplits: 3)
        switch words.first {
        case "READONLY": return .readOnly
        case "LOADING": return .loading
        case "MOVED", "ASK":
            guard words.count == 3, let address = address(words[2]) else { return .other }
            return words[0] == "MOVED" ? .moved(address) : .ask(address)
        case "TRYAGAIN": return .tryAgain
        case "CLUSTERDOWN": return .clusterDown
        case "NOSCRIPT": return .noScript
        case "OOM": return .outOfMemory
        case "BUSY": return .busy
        case "MASTERDOWN": return .masterDown
        case "NOAUTH", "WRONGPASS": return .authentication
        case "NOPERM": return .noPermission
        case "ERR":
            if message.hasPrefix("ERR unknown command") { return .unknownCommand }
            if message.contains("DB index") { return .noDatabase }
            // Before Redis 6: "ERR invalid password", "ERR Client sent AUTH, but no password is
            // set"; since: "ERR AUTH <password> called without any password configured …".
            if message.hasPrefix("ERR invalid password") || message.hasPrefix("ERR Client sent AUTH") || message.hasPrefix("ERR AUTH") {
                return .authentication
            }
            return .other
        default: return .other
        }
    }

    /// `host:port` of a redirect; an IPv6 host may come bracketed or bare.
    static func address(_ text: Substring) -> RedisAddress? {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), port > 0, port < 65536 else { return nil }
        var host = text[..<colon]
        if host.hasPrefix("["), host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        guard !host.isEmpty else { return nil }
        return RedisAddress(host: String(host), port: port)
    }
}
