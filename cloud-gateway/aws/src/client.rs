//! The EC2, ELB, ELBv2, Auto Scaling and EKS clients: region, endpoints (one for all, or one
//! per API) and credentials from the SDK's standard
//! chain (environment, shared config and credentials files, web identity
//! for IRSA, container and instance metadata), optionally through an
//! assumed role. The SDK does not retry: a throttled request must reach the
//! gateway's budget, and the gateway's callers retry what is retryable.
//! Every request the SDK sends is counted for the budget
//! ([`crate::provider::count_api_request`]).

use anyhow::Context as _;
use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_ec2::config::{ConfigBag, Intercept, Region, RuntimeComponents};
use aws_sdk_ec2::error::BoxError;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

use crate::settings::AwsSettings;

/// Counts each request the SDK transmits, retries and credential calls
/// excluded (those go through their own clients).
#[derive(Debug)]
struct CountRequests;

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        ccm_provider::count_api_request();
        Ok(())
    }
}

/// The clients the provider uses, built on one shared configuration.
pub(super) struct Clients {
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancingv2::Client,
    pub classic: aws_sdk_elasticloadbalancing::Client,
    pub autoscaling: aws_sdk_autoscaling::Client,
    pub eks: aws_sdk_eks::Client,
    pub region: String,
}

/// Builds the EC2, ELBv2, (Classic) ELB, Auto Scaling and EKS clients. Nothing is sent to AWS yet (except
/// what the credential chain asks of metadata services).
pub(super) async fn clients(settings: &AwsSettings) -> anyhow::Result<Clients> {
    // rustls on ring, the provider kube and tonic use, so the process has
    // one crypto provider.
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(std::time::Duration::from_secs(5))
                .operation_attempt_timeout(settings.request_timeout)
                .operation_timeout(settings.request_timeout)
                .build(),
        );
    if let Some(region) = &settings.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &settings.endpoint_url {
        loader = loader.endpoint_url(url.clone());
    }
    let mut shared = loader.load().await;
    let endpoint = |api: &str| settings.endpoints.get(api).cloned();
    let region = shared
        .region()
        .map(ToString::to_string)
        .context("no AWS region: set --aws-region, AWS_REGION or a region in the AWS profile")?;
    if let Some(role) = &settings.role_arn {
        let sts = match endpoint("sts") {
            Some(url) => shared.clone().into_builder().endpoint_url(url).build(),
            None => shared.clone(),
        };
        let mut assume = AssumeRoleProvider::builder(role.clone())
            .session_name(settings.role_session_name.clone())
            .configure(&sts);
        if let Some(id) = &settings.external_id {
            assume = assume.external_id(id.clone());
        }
        let assumed = assume.build().await;
        shared = shared
            .into_builder()
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(assumed),
            )
            .build();
    }
    // ELB and ELBv2 share one API endpoint, as in AWS.
    let mut ec2 = aws_sdk_ec2::config::Builder::from(&shared).interceptor(CountRequests);
    let mut elb =
        aws_sdk_elasticloadbalancingv2::config::Builder::from(&shared).interceptor(CountRequests);
    let mut classic =
        aws_sdk_elasticloadbalancing::config::Builder::from(&shared).interceptor(CountRequests);
    let mut autoscaling =
        aws_sdk_autoscaling::config::Builder::from(&shared).interceptor(CountRequests);
    let mut eks = aws_sdk_eks::config::Builder::from(&shared).interceptor(CountRequests);
    if let Some(url) = endpoint("autoscaling") {
        autoscaling.set_endpoint_url(Some(url));
    }
    if let Some(url) = endpoint("eks") {
        eks.set_endpoint_url(Some(url));
    }
    if let Some(url) = endpoint("ec2") {
        ec2.set_endpoint_url(Some(url));
    }
    if let Some(url) = endpoint("elasticloadbalancing") {
        elb.set_endpoint_url(Some(url.clone()));
        classic.set_endpoint_url(Some(url));
    }
    Ok(Clients {
        ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
        elb: aws_sdk_elasticloadbalancingv2::Client::from_conf(elb.build()),
        classic: aws_sdk_elasticloadbalancing::Client::from_conf(classic.build()),
        autoscaling: aws_sdk_autoscaling::Client::from_conf(autoscaling.build()),
        eks: aws_sdk_eks::Client::from_conf(eks.build()),
        region,
    })
}
