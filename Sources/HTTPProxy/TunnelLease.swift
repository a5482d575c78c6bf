import NIOConcurrencyHelpers
import NIOCore

/// A handle on an upgraded connection (WebSocket) that its guard can end later: the session
/// behind it was revoked or ended. The guard creates one with a `.forward` verdict; the proxy
/// attaches both channels when the upgrade completes and calls `onEnd` when the tunnel closes.
/// `end()` before the upgrade completes makes the upgrade close at once.
public final class TunnelLease: Sendable {
    private struct State {
        var channels: [any Channel] = []
        var ended = false
        var finished = false
        var expiry: Scheduled<Void>? = nil
    }

    private let state = NIOLockedValueBox(State())
    private let onEnd: @Sendable (TunnelLease) -> Void

    /// - Parameter onEnd: called once when the tunnel is gone (closed by either side or ended).
    public init(onEnd: @escaping @Sendable (TunnelLease) -> Void = { _ in }) {
        self.onEnd = onEnd
    }

    /// Closes the tunnel (both sides); idempotent. A tunnel not open yet closes as it opens.
    public func end() {
        let channels = state.withLockedValue { s -> [any Channel] in
            s.ended = true
            defer { s.channels = [] }
            return s.channels
        }
        for channel in channels { channel.close(promise: nil) }
        finish()
    }

    /// Ends the tunnel after `delay` at the latest (the session's absolute expiry); the timer
    /// is cancelled when the tunnel goes away first.
    public func expire(after delay: TimeAmount, on loop: any EventLoop) {
        let scheduled = loop.scheduleTask(in: delay) { [weak self] () -> Void in self?.end() }
        let finishedAlready = state.withLockedValue { s -> Bool in
            if !s.finished { s.expiry = scheduled }
            return s.finished
        }
        if finishedAlready { scheduled.cancel() }
    }

    public var isEnded: Bool { state.withLockedValue { $0.ended } }

    /// The upgrade completed: these channels now carry the tunnel.
    func attach(_ channels: [any Channel]) {
        let endedAlready = state.withLockedValue { s -> Bool in
            if !s.ended { s.channels = channels }
            return s.ended
        }
        if endedAlready { channels.forEach { $0.close(promise: nil) } }
        guard let first = channels.first else { return finish() }
        first.closeFuture.whenComplete { _ in self.finish() }
    }

    /// The request ended without an upgrade (refused, failed, answered locally), or the tunnel
    /// closed: `onEnd` runs once.
    func finish() {
        let (first, expiry) = state.withLockedValue { s -> (Bool, Scheduled<Void>?) in
            defer { s.finished = true; s.channels = []; s.expiry = nil }
            return (!s.finished, s.expiry)
        }
        expiry?.cancel()
        if first { onEnd(self) }
    }
}
