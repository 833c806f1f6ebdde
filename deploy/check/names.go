package main

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
)

// namingProblems applies the apiserver's naming rules to the names a
// template computes (from a release name, a value, a config key). The
// typed decode cannot see these: any string fits a string field.
func namingProblems(obj runtime.Object, meta metav1.Object) []string {
	var problems []string
	add := func(field string, errs []string) {
		for _, e := range errs {
			problems = append(problems, fmt.Sprintf("%s: %s", field, e))
		}
	}
	if _, isService := obj.(*corev1.Service); isService {
		add("metadata.name", validation.IsDNS1035Label(meta.GetName()))
	} else {
		add("metadata.name", validation.IsDNS1123Subdomain(meta.GetName()))
	}
	for key, value := range meta.GetLabels() {
		add("metadata.labels "+key, validation.IsQualifiedName(key))
		add("metadata.labels "+key, validation.IsValidLabelValue(value))
	}
	switch o := obj.(type) {
	case *appsv1.StatefulSet:
		add("spec.serviceName", validation.IsDNS1035Label(o.Spec.ServiceName))
		for i, claim := range o.Spec.VolumeClaimTemplates {
			add(fmt.Sprintf("spec.volumeClaimTemplates[%d].metadata.name", i), validation.IsDNS1123Label(claim.Name))
		}
		problems = append(problems, podProblems("spec.template.spec", o.Spec.Template.Spec, claimNames(o.Spec.VolumeClaimTemplates))...)
	case *appsv1.Deployment:
		problems = append(problems, podProblems("spec.template.spec", o.Spec.Template.Spec, nil)...)
	case *corev1.Service:
		for i, port := range o.Spec.Ports {
			if port.Name != "" {
				add(fmt.Sprintf("spec.ports[%d].name", i), validation.IsValidPortName(port.Name))
			}
		}
	}
	return problems
}

func claimNames(claims []corev1.PersistentVolumeClaim) map[string]bool {
	names := map[string]bool{}
	for _, claim := range claims {
		names[claim.Name] = true
	}
	return names
}

// podProblems checks a pod's container, port, volume and environment
// variable names, and that each volume mount names a volume of the pod
// (or a claim template of its StatefulSet).
func podProblems(at string, pod corev1.PodSpec, claims map[string]bool) []string {
	var problems []string
	add := func(field string, errs []string) {
		for _, e := range errs {
			problems = append(problems, fmt.Sprintf("%s: %s", field, e))
		}
	}
	volumes := map[string]bool{}
	for name := range claims {
		volumes[name] = true
	}
	for i, volume := range pod.Volumes {
		add(fmt.Sprintf("%s.volumes[%d].name", at, i), validation.IsDNS1123Label(volume.Name))
		if volumes[volume.Name] {
			add(fmt.Sprintf("%s.volumes[%d].name", at, i), []string{fmt.Sprintf("%q is declared twice", volume.Name)})
		}
		volumes[volume.Name] = true
	}
	groups := map[string][]corev1.Container{
		"initContainers": pod.InitContainers,
		"containers":     pod.Containers,
	}
	for group, containers := range groups {
		for i, c := range containers {
			here := fmt.Sprintf("%s.%s[%d]", at, group, i)
			add(here+".name", validation.IsDNS1123Label(c.Name))
			for j, port := range c.Ports {
				if port.Name != "" {
					add(fmt.Sprintf("%s.ports[%d].name", here, j), validation.IsValidPortName(port.Name))
				}
			}
			for j, env := range c.Env {
				add(fmt.Sprintf("%s.env[%d].name", here, j), validation.IsEnvVarName(env.Name))
			}
			for j, mount := range c.VolumeMounts {
				if !volumes[mount.Name] {
					add(fmt.Sprintf("%s.volumeMounts[%d].name", here, j), []string{fmt.Sprintf("%q names no volume of the pod", mount.Name)})
				}
			}
		}
	}
	return problems
}
