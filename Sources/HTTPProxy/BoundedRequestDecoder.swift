import NIOCore
import NIOHTTP1

/// What a chunked request body has cost in bytes on the wire, beside the body itself. The
/// proxy handler opens it at a chunked request head and counts each body part; the decoder
/// below adds the raw bytes it consumed. Both run on the connection's event loop.
final class RequestBodyMeter {
    private(set) var open = false
    /// Changes at every `start()`: a decode call that spans two requests counts for neither.
    private(set) var generation: UInt64 = 0
    private(set) var parts = 0
    private(set) var bodyBytes = 0
    var rawBytes = 0

    func start(chunked: Bool) {
        open = chunked
        generation &+= 1
        parts = 0
        bodyBytes = 0
        rawBytes = 0
    }

    func received(_ count: Int) {
        parts += 1
        bodyBytes += count
    }

    func end() { open = false }

    /// Chunk-size lines, their extensions and CRLFs may take 64 bytes per body part, plus 4 KiB
    /// (one bound for trailers and the odd long line); beyond that a client is sending framing,
    /// not a body (`5;aaaa…` forever), and the request is refused.
    static let slack = 4096
    static let perPart = 64

    var isOverBudget: Bool { rawBytes - bodyBytes > Self.slack + Self.perPart * parts }
}

/// The failure a chunked body with unbounded framing (chunk extensions) ends in: 400 and close.
struct ChunkFramingTooLarge: Error {}

/// NIO's request decoder, with a bound on what a chunked body may spend on framing: llhttp
/// skips chunk extensions without limit or callback, so the bytes it consumed are compared with
/// the body it delivered (`RequestBodyMeter`). Bytes read in the same call as the request head
/// are not counted, so the bound is "one read plus the budget". No extra channel handler.
struct BoundedRequestDecoder: ByteToMessageDecoder {
    typealias InboundOut = HTTPServerRequestPart

    let inner: HTTPRequestDecoder
    let meter: RequestBodyMeter

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let counted = meter.open
        let generation = meter.generation
        let before = buffer.readableBytes
        let state = try inner.decode(context: context, buffer: &buffer)
        if counted, meter.open, meter.generation == generation {
            meter.rawBytes += before - buffer.readableBytes
            if meter.isOverBudget { throw ChunkFramingTooLarge() }
        }
        return state
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        try inner.decodeLast(context: context, buffer: &buffer, seenEOF: seenEOF)
    }

    mutating func decoderAdded(context: ChannelHandlerContext) { inner.decoderAdded(context: context) }

    mutating func decoderRemoved(context: ChannelHandlerContext) { inner.decoderRemoved(context: context) }
}
