import NIOCore
import NIOHTTP1

/// Collects one request at a time from NIO's HTTP/1 decoder and decides when it is complete:
/// the decisions of `SimulatorRequestHandler`, testable without a channel.
struct SimulatorRequestCollector {
    /// Bodies above this many bytes are refused with 413 (no endpoint takes more than a form).
    let maxBodyBytes: Int

    private enum State {
        case idle
        case collecting(HTTPRequestHead, ByteBuffer)
        /// The body went over `maxBodyBytes`: the rest is read and dropped until the end.
        case overLimit(HTTPRequestHead)
    }

    enum Action: Equatable {
        /// Keep reading.
        case wait
        /// A whole request: answer it.
        case respond(HTTPRequestHead, ByteBuffer)
        /// A request whose body was too large: answer 413 and close.
        case refuseTooLarge(HTTPRequestHead)
    }

    private var state = State.idle

    init(maxBodyBytes: Int = 64 * 1024) { self.maxBodyBytes = maxBodyBytes }

    mutating func receive(_ part: HTTPServerRequestPart) -> Action {
        switch (part, state) {
        case (.head(let head), _):
            state = .collecting(head, ByteBuffer())
            return .wait
        case (.body(var chunk), .collecting(let head, var body)):
            if body.readableBytes + chunk.readableBytes > maxBodyBytes {
                state = .overLimit(head)
            } else {
                body.writeBuffer(&chunk)
                state = .collecting(head, body)
            }
            return .wait
        case (.body, .overLimit), (.body, .idle), (.end, .idle):
            return .wait
        case (.end, .collecting(let head, let body)):
            state = .idle
            return .respond(head, body)
        case (.end, .overLimit(let head)):
            state = .idle
            return .refuseTooLarge(head)
        }
    }
}
