/// Why a Redis call failed, classified once.
public enum RedisError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Redis answered with an error reply (`WRONGTYPE …`, `NOAUTH …`).
    case server(String)
    /// No answer within the command timeout (`store.timeout`).
    case timeout
    /// Not connected (connecting, backing off after a failure, or the connection dropped).
    case unavailable
    /// The byte stream was not RESP (what was wrong with it); the connection is closed.
    case protocolError(String)
    /// The TLS handshake failed (certificate not trusted, wrong name, client certificate refused).
    case tls(String)
    /// No sentinel could name the master.
    case sentinel(String)
    /// Behind sentinels, the server dialled is not (or no longer) the master.
    case notMaster

    /// The server will not run this command for this client: an ACL without the command's
    /// category (`NOPERM`), or a command renamed away (`ERR unknown command`). Retrying it is
    /// pointless; a caller with another way to the same answer should take it.
    public var isRefusedCommand: Bool {
        guard case .server(let message) = self else { return false }
        return message.hasPrefix("NOPERM ") || message.hasPrefix("ERR unknown command")
    }

    public var description: String {
        switch self {
        case .server(let message): return "redis error: \(message.prefix(120))"
        case .timeout: return "redis timeout"
        case .unavailable: return "redis unavailable"
        case .protocolError(let reason): return "redis protocol error: \(reason)"
        case .tls(let detail): return "TLS handshake with redis failed: \(detail)"
        case .sentinel(let detail): return "redis sentinel: \(detail)"
        case .notMaster: return "the server the sentinels named is not the master (a failover in progress)"
        }
    }
}
