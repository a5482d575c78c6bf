import Logging
import NIOCore
import ServiceLifecycle
import Sessions

/// This instance's side of the fleet's channel (Redis pub/sub): what it tells the others.
/// Without Redis (the memory store) there are no others, and publishing does nothing.
struct FleetPublisher: Sendable {
    let backend: RedisSessionBackend?
    let logger: Logger

    func publish(_ message: FleetMessage, on loop: any EventLoop) {
        backend?.publish(message, on: loop).whenFailure { error in
            logger.warning("could not publish to the other instances; they catch up within store.local_cache_ttl (a validation waiter within its lock's TTL)",
                           metadata: ["error": "\(error)"])
        }
    }
}

/// What the fleet tells this instance, applied in the order it arrived: invalidations reach
/// the local cache and the open tunnels (`Revocations.received`), stored validation results wake
/// the re-validations waiting for them. Runs from start until the group shuts down; the backend
/// subscribes (`CoreResources.start`) and feeds `signals`.
struct FleetSubscriber: Service {
    enum Signal: Sendable {
        case message(FleetMessage)
        /// (Re)subscribed: messages may have been missed meanwhile.
        case subscribed
    }

    let signals: AsyncStream<Signal>
    let revocations: Revocations
    let revalidator: Revalidator?

    /// The listener to build the backend with, and the stream it feeds.
    static func listener(on loop: any EventLoop) -> (RedisSessionBackend.Listener, AsyncStream<Signal>) {
        let (signals, continuation) = AsyncStream.makeStream(of: Signal.self)
        let listener = RedisSessionBackend.Listener(on: loop, onMessage: { continuation.yield(.message($0)) },
                                                    onSubscribed: { continuation.yield(.subscribed) })
        return (listener, signals)
    }

    func run() async {
        for await signal in signals.cancelOnGracefulShutdown() {
            switch signal {
            case .message(.validated(let tokenHash)): revalidator?.resultStored(tokenHash)
            case .message(let message): revocations.received(message)
            case .subscribed: revocations.resubscribed()
            }
        }
    }
}
