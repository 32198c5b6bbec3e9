#!/usr/bin/env bash
# Create the artifact bucket and the node role policy (needs the AWS CLI and admin credentials).
#   BUCKET=my-bucket REGION=us-west-2 bash infra/s3/setup.sh
set -euo pipefail
: "${BUCKET:?set BUCKET}" "${REGION:=us-west-2}"
aws s3api create-bucket --bucket "$BUCKET" --region "$REGION" --create-bucket-configuration LocationConstraint="$REGION"
aws s3api put-public-access-block --bucket "$BUCKET" --public-access-block-configuration \
  BlockPublicAcls=true,IgnorePublicAcls=true,BlockPublicPolicy=true,RestrictPublicBuckets=true
sed "s/my-bucket/$BUCKET/g" "$(dirname "$0")/iam-policy.json" > /tmp/longrag-policy.json
aws iam create-policy --policy-name longrag-artifacts --policy-document file:///tmp/longrag-policy.json
echo "attach the policy 'longrag-artifacts' to the role of instance profile longrag-ray-node (or the IRSA role)"
