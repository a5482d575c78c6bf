import NIOCore
import NIOHTTP1

/// A request as the simulator's endpoints see it: the head and the whole body.
struct SimulatorRequest: Sendable {
    var head: HTTPRequestHead
    var body: ByteBuffer
    var remoteAddress: SocketAddress?

    /// The request target's path, without the query.
    var path: Substring { head.uri.prefix { $0 != "?" } }

    /// The request target's query (after the first `?`); empty if it has none.
    var query: Substring {
        guard let mark = head.uri.firstIndex(of: "?") else { return "" }
        return head.uri[head.uri.index(after: mark)...]
    }
}
