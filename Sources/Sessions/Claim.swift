/// A fleet-wide claim (`SET NX PX`): held by one caller at a time until released or expired.
/// Its store key carries the hash tag DESIGN §3 gives it (one cluster slot per subject).
public enum Claim: Sendable, Equatable {
    /// The single flight of a refresh token's validation: `lock:validation:{<token hash>}`.
    case validation(tokenHash: String)
    /// The one probe of a client Apple refused: `lock:probe:{<client id>}`.
    case probe(clientID: String)
    /// A notification already acted on (dedupe by `jti`): `notification:{<jti>}`.
    case notification(jti: String)
    /// One attempt at an outbox job: `lock:job:{<id>}`.
    case job(id: String)
    /// One mover of a transferred user: `lock:transfer:{<transfer id>}`.
    case transfer(id: String)
    /// A sign-in ticket redeemed (single use, `SignInTicket`): `ticket:{<id>}`.
    case ticket(id: String)

    /// The key under the store's prefix.
    public var name: String {
        switch self {
        case .validation(let hash): "lock:validation:{" + hash + "}"
        case .probe(let clientID): "lock:probe:{" + clientID + "}"
        case .notification(let jti): "notification:{" + jti + "}"
        case .transfer(let id): "lock:transfer:{" + id + "}"
        case .job(let id): "lock:job:{" + id + "}"
        case .ticket(let id): "ticket:{" + id + "}"
        }
    }
}
