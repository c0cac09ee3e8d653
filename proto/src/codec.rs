//! The protobuf codec of every cloudgateway.v1 stub. It is prost's own,
//! except that a message that does not decode is `INVALID_ARGUMENT`: the
//! caller sent bad bytes. The gRPC status-code guide says `INTERNAL` for
//! that, but `INTERNAL` pages whoever runs the gateway for a client's
//! mistake.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder};

/// prost's codec with decode errors mapped to `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct StrictCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for StrictCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(self.0.decoder())
    }
}

/// The decoder of [`StrictCodec`].
#[derive(Debug)]
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => Status::invalid_argument(format!(
                "the request is not a valid protobuf message: {}",
                status.message()
            )),
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
