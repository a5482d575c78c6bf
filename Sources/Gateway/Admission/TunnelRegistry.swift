import HTTPProxy
import NIOCore
import NIOConcurrencyHelpers
import Sessions

/// The WebSocket tunnels open on this instance, by user: when a user's or a session's
/// invalidation arrives (revocation, logout, Apple's notification — locally or over pub/sub),
/// each tunnel of that user is checked against the store and ended if its session is gone.
/// An open socket must not outlive the session that admitted it.
final class TunnelRegistry: Sendable {
    struct Entry {
        let lease: TunnelLease
        let handle: SessionHandle
        /// The session lifetimes of the configuration that admitted the tunnel: it is checked
        /// against them.
        let times: SessionTimes
    }

    private let bySub = NIOLockedValueBox<[String: [ObjectIdentifier: Entry]]>([:])

    /// A lease for a tunnel about to be opened for this session; it leaves the registry when
    /// the tunnel closes (or never opens), and ends at `endsIn` at the latest (the session's
    /// absolute expiry: no tunnel outlives its session).
    func open(handle: SessionHandle, sub: String, times: SessionTimes, endsIn: TimeAmount, on loop: any EventLoop) -> TunnelLease {
        let lease = TunnelLease { [weak self] lease in
            self?.bySub.withLockedValue { map in
                map[sub]?[ObjectIdentifier(lease)] = nil
                if map[sub]?.isEmpty == true { map[sub] = nil }
            }
        }
        bySub.withLockedValue { $0[sub, default: [:]][ObjectIdentifier(lease)] = Entry(lease: lease, handle: handle, times: times) }
        lease.expire(after: endsIn, on: loop)
        return lease
    }

    /// The tunnels of a user.
    func tunnels(of sub: String) -> [Entry] {
        bySub.withLockedValue { map in map[sub].map { Array($0.values) } ?? [] }
    }

    /// The tunnels of one session (by its store key).
    func tunnels(ofSession key: String) -> [Entry] {
        bySub.withLockedValue { map in map.values.flatMap { $0.values.filter { $0.handle.key == key } } }
    }

    /// Every open tunnel.
    var all: [Entry] { bySub.withLockedValue { map in map.values.flatMap { $0.values } } }

    var count: Int { bySub.withLockedValue { $0.values.reduce(0) { $0 + $1.count } } }
}
