import NIOCore

/// Between the socket (or TLS) and NIOHTTP2's handler: closes the connection once a GOAWAY with
/// an error code has been written. NIOHTTP2 answers a connection error (a flood, a header block
/// that never ends, a frame it cannot parse) with GOAWAY but leaves the connection open, and
/// reports the error exactly as it reports a stream error, which must not close it: the frame it
/// wrote is the one sure sign of which it was.
final class HTTP2GoAwayWatcher: ChannelOutboundHandler {
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    private var scanner = HTTP2FrameScanner()
    private var closing = false

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let goAway: Bool
        switch unwrapOutboundIn(data) {
        case .byteBuffer(let buffer): goAway = scanner.scan(buffer)
        case .fileRegion(let region): goAway = scanner.skip(region.readableBytes)
        }
        guard goAway, !closing else { return context.write(data, promise: promise) }
        closing = true
        let channel = context.channel
        let written = promise ?? context.eventLoop.makePromise()
        written.futureResult.whenComplete { _ in channel.close(promise: nil) }
        context.writeAndFlush(data, promise: written)
    }
}

/// Follows the frames in the bytes an HTTP/2 endpoint writes (RFC 9113 §4.1: a 9-byte header,
/// its 24-bit length, then the payload), whatever the writes' boundaries, and tells when a GOAWAY
/// with an error code other than NO_ERROR has been seen whole enough to read its code.
struct HTTP2FrameScanner {
    /// The bytes of the frame header (or GOAWAY payload prefix) read so far.
    private var pending: [UInt8] = []
    /// Payload bytes of the current frame still to pass.
    private var remaining = 0
    /// The current frame is a GOAWAY whose first 8 payload bytes (last stream ID, error code) are
    /// being collected.
    private var readingGoAway = false

    init() { pending.reserveCapacity(9) }

    /// Passes `buffer`; true when it completed a GOAWAY with an error code.
    mutating func scan(_ buffer: ByteBuffer) -> Bool {
        buffer.withUnsafeReadableBytes { raw in
            var found = false
            var i = 0
            while i < raw.count {
                if readingGoAway {
                    pending.append(raw[i])
                    i += 1
                    remaining -= 1
                    if pending.count == 8 {
                        readingGoAway = false
                        let code = pending[4...7].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
                        if code != 0 { found = true }
                        pending.removeAll(keepingCapacity: true)
                    }
                } else if remaining > 0 {
                    let step = min(remaining, raw.count - i)
                    remaining -= step
                    i += step
                } else {
                    pending.append(raw[i])
                    i += 1
                    guard pending.count == 9 else { continue }
                    remaining = Int(pending[0]) << 16 | Int(pending[1]) << 8 | Int(pending[2])
                    readingGoAway = pending[3] == 0x07 && remaining >= 8
                    pending.removeAll(keepingCapacity: true)
                }
            }
            return found
        }
    }

    /// Passes `count` bytes not looked at (a file region: only ever a DATA payload).
    mutating func skip(_ count: Int) -> Bool {
        remaining = max(remaining - count, 0)
        return false
    }
}
