import NIOCore
import NIOHTTP1

/// An answer of the simulator. The server adds the framing (`content-length`, `connection:
/// close` when the connection ends) and `cache-control: no-store`, as Apple's token endpoint
/// sends it (apple-sign-in.md §3.1).
struct SimulatorResponse: Sendable {
    var status: HTTPResponseStatus
    var contentType: String
    var body: ByteBuffer
    /// Further headers (e.g. `location`, `pragma`, `retry-after`).
    var headers: [(String, String)]
    /// Hold the response this long before sending it (the latency fault).
    var delay: TimeAmount = .zero

    init(status: HTTPResponseStatus = .ok, contentType: String = "text/plain; charset=utf-8", body: ByteBuffer, headers: [(String, String)] = []) {
        self.status = status
        self.contentType = contentType
        self.body = body
        self.headers = headers
    }

    init(status: HTTPResponseStatus = .ok, contentType: String = "text/plain; charset=utf-8", _ text: String, headers: [(String, String)] = []) {
        self.init(status: status, contentType: contentType, body: ByteBuffer(string: text), headers: headers)
    }
}
