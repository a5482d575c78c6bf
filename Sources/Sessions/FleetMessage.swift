/// What one instance tells the others over the channel `<prefix>invalidate` (DESIGN §3): forget
/// every session of a user (a revocation, a changed profile) or one session (a logout), or read
/// a refresh token's validation result again (it was just stored).
public enum FleetMessage: Sendable, Equatable {
    case user(String)
    case session(SessionHandle)
    /// A validation result for this token hash is in the store: instances waiting on the
    /// lock holder read it now.
    case validated(tokenHash: String)

    /// The message on the wire: `user <sub>`, `session <hash>`, `validated <token hash>`.
    public var payload: String {
        switch self {
        case .user(let sub): "user " + sub
        case .session(let handle): "session " + handle.key
        case .validated(let hash): "validated " + hash
        }
    }

    /// A message read back; nil for anything else (a newer instance's message kind, junk).
    public init?(payload: [UInt8]) {
        let text = String(decoding: payload, as: UTF8.self)
        if text.hasPrefix("user "), text.utf8.count > 5 {
            self = .user(String(text.dropFirst(5)))
        } else if text.hasPrefix("session "), let handle = SessionHandle(key: String(text.dropFirst(8))) {
            self = .session(handle)
        } else if text.hasPrefix("validated "), SessionHandle(key: String(text.dropFirst(10))) != nil {
            self = .validated(tokenHash: String(text.dropFirst(10)))
        } else {
            return nil
        }
    }
}
